//! What a mistake in the daemon's configuration file says (issue 31): the file, the field's full path
//! and its line, for type errors and unknown keys as for bad values.

use dd_server::{ServerConfig, ServerError};

fn error_of(text: &str) -> (String, String) {
    match ServerConfig::from_toml(text) {
        Err(ServerError::Config { field, reason }) => (field, reason),
        other => panic!("want a configuration error for {text:?}, got {other:?}"),
    }
}

#[test]
fn regression_a_type_error_named_no_field_and_no_line() {
    // Before: `invalid type: integer 7411, expected a string`, with no field and no line.
    let (field, reason) = error_of("# the daemon\n\n[listen]\ntcp = 7411\n");
    assert_eq!(field, "listen.tcp", "{reason}");
    assert!(reason.starts_with("line 4: "), "{reason}");
    assert!(reason.contains("expected a string"), "{reason}");
}

#[test]
fn regression_an_unknown_field_named_no_table() {
    // Before: `unknown field capacity`, naming neither its table nor its line.
    let (field, reason) = error_of("[engine.mem]\ncapacity_bytes = 1048576\ncapacity = 1\n");
    assert_eq!(field, "engine.mem.capacity", "{reason}");
    assert!(reason.starts_with("line 3: "), "{reason}");
    // An inline table and a top-level key too.
    let (field, reason) = error_of("engine = { mem = { capacity = 1 } }\n");
    assert_eq!(field, "engine.mem.capacity", "{reason}");
    assert!(reason.starts_with("line 1: "), "{reason}");
    let (field, reason) = error_of("ssd_enabled = true\nlisten_tcp = \"x\"\n");
    assert_eq!(field, "listen_tcp", "{reason}");
    assert!(reason.starts_with("line 2: "), "{reason}");
}

#[test]
fn a_syntax_error_names_its_line() {
    let (field, reason) = error_of("[listen]\ntcp = \"127.0.0.1:7411\n");
    assert_eq!(field, "(syntax)");
    assert!(reason.starts_with("line 2: "), "{reason}");
}

#[test]
fn a_file_error_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("doubledecker.toml");
    std::fs::write(&p, "[listen]\ntcp = 7411\n").unwrap();
    let e = ServerConfig::load(Some(&p)).unwrap_err().to_string();
    assert!(e.contains("listen.tcp") && e.contains("line 2") && e.contains("doubledecker.toml"), "{e}");
}
