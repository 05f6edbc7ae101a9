//! memcached protocol encoding and parsing (text protocol `get`, meta `ms` / `mn`).

use super::{Result, ServerBenchError};
use std::io::BufRead;

/// The memcached key of page key `k` (ASCII, no spaces or control characters, < 250 bytes).
pub fn key_name(k: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"dd:");
    out.extend_from_slice(k.to_string().as_bytes());
}

fn parse_key_name(name: &[u8]) -> Option<u64> {
    std::str::from_utf8(name.strip_prefix(b"dd:")?).ok()?.parse().ok()
}

/// Appends the multi-get `get k1 k2 ...\r\n`.
pub fn encode_get(keys: &[u64], out: &mut Vec<u8>) {
    out.extend_from_slice(b"get");
    for &k in keys {
        out.push(b' ');
        key_name(k, out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends one quiet meta set per key (`ms <key> <len> q\r\n<value>\r\n`: success is silent, only
/// a failure answers) and a meta no-op `mn\r\n`, whose `MN\r\n` ends the batch's answer.
pub fn encode_sets(keys: &[u64], vals: &[u8], value_size: usize, out: &mut Vec<u8>) {
    for (i, &k) in keys.iter().enumerate() {
        out.extend_from_slice(b"ms ");
        key_name(k, out);
        out.extend_from_slice(format!(" {value_size} q\r\n").as_bytes());
        out.extend_from_slice(&vals[i * value_size..(i + 1) * value_size]);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"mn\r\n");
}

fn read_line<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> Result<()> {
    line.clear();
    let n = r.read_until(b'\n', line)?;
    if n == 0 {
        return Err(ServerBenchError::Protocol("connection closed by memcached".into()));
    }
    if !line.ends_with(b"\r\n") {
        return Err(ServerBenchError::Protocol(format!(
            "line without CRLF: {:?}",
            String::from_utf8_lossy(line)
        )));
    }
    line.truncate(line.len() - 2);
    Ok(())
}

fn error_line(line: &[u8]) -> ServerBenchError {
    ServerBenchError::Memcached(String::from_utf8_lossy(line).into_owned())
}

/// Reads one multi-get answer (`VALUE <key> <flags> <bytes>\r\n<data>\r\n` per hit, then
/// `END\r\n`), calling `on_value(key, data)` per hit; returns the number of hits.
pub fn read_get_response<R: BufRead>(
    r: &mut R,
    line: &mut Vec<u8>,
    data: &mut Vec<u8>,
    mut on_value: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<usize> {
    let mut hits = 0;
    loop {
        read_line(r, line)?;
        if line == b"END" {
            return Ok(hits);
        }
        let Some(rest) = line.strip_prefix(b"VALUE ") else {
            return Err(error_line(line));
        };
        let mut f = rest.split(|b| *b == b' ');
        let (Some(name), Some(_flags), Some(len)) = (f.next(), f.next(), f.next()) else {
            return Err(ServerBenchError::Protocol(format!(
                "bad VALUE line {:?}",
                String::from_utf8_lossy(line)
            )));
        };
        let key = parse_key_name(name).ok_or_else(|| {
            ServerBenchError::Protocol(format!("unexpected key {:?}", String::from_utf8_lossy(name)))
        })?;
        let len: usize = std::str::from_utf8(len)
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|n| *n <= 1 << 20)
            .ok_or_else(|| ServerBenchError::Protocol("bad VALUE length".into()))?;
        data.resize(len + 2, 0);
        r.read_exact(data)?;
        if &data[len..] != b"\r\n" {
            return Err(ServerBenchError::Protocol("value not followed by CRLF".into()));
        }
        on_value(key, &data[..len])?;
        hits += 1;
    }
}

/// Reads the answer of an [`encode_sets`] batch: `MN` alone means every set succeeded; any line
/// before it is a failed set (`NS`, `SERVER_ERROR ...`, `CLIENT_ERROR ...`) and fails the batch.
pub fn read_sets_response<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> Result<()> {
    read_line(r, line)?;
    if line == b"MN" {
        Ok(())
    } else {
        Err(error_line(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{stamp, stamped, VALUE_SIZE};
    use std::io::Cursor;

    #[test]
    fn encodes_multi_get_and_quiet_sets() {
        let mut out = Vec::new();
        encode_get(&[1, 22, 333], &mut out);
        assert_eq!(out, b"get dd:1 dd:22 dd:333\r\n");
        out.clear();
        let vals: Vec<u8> = (0..8).collect();
        encode_sets(&[5, 6], &vals, 4, &mut out);
        assert_eq!(out, b"ms dd:5 4 q\r\n\x00\x01\x02\x03\r\nms dd:6 4 q\r\n\x04\x05\x06\x07\r\nmn\r\n");
    }

    #[test]
    fn parses_multi_get_answers() {
        let mut v = vec![0u8; VALUE_SIZE];
        stamp(&mut v, 22);
        let mut wire = b"VALUE dd:22 0 4096\r\n".to_vec();
        wire.extend_from_slice(&v);
        wire.extend_from_slice(b"\r\nEND\r\nEND\r\n");
        let mut r = Cursor::new(wire);
        let (mut line, mut data) = (Vec::new(), Vec::new());
        let mut seen = Vec::new();
        let hits = read_get_response(&mut r, &mut line, &mut data, |k, d| {
            seen.push((k, stamped(d, k)));
            Ok(())
        })
        .unwrap();
        assert_eq!((hits, seen), (1, vec![(22, true)]));
        // A second answer with no hits (all misses) is just END.
        assert_eq!(read_get_response(&mut r, &mut line, &mut data, |_, _| Ok(())).unwrap(), 0);
        // The stream is exhausted: reading again is an error, not a hang or a panic.
        assert!(read_get_response(&mut r, &mut line, &mut data, |_, _| Ok(())).is_err());
    }

    #[test]
    fn rejects_malformed_get_answers() {
        let (mut line, mut data) = (Vec::new(), Vec::new());
        for wire in [
            &b"VALUE dd:1 0 4\r\nabcdXX"[..],      // value not followed by CRLF
            b"VALUE other 0 4\r\nabcd\r\nEND\r\n", // a key we never asked for
            b"SERVER_ERROR out of memory\r\n",     // an error instead of values
            b"VALUE dd:1 0\r\n",                   // missing length
            b"END\n",                              // bare LF
        ] {
            let mut r = Cursor::new(wire.to_vec());
            assert!(read_get_response(&mut r, &mut line, &mut data, |_, _| Ok(())).is_err(), "{wire:?}");
        }
    }

    #[test]
    fn parses_set_batch_answers() {
        let mut line = Vec::new();
        assert!(read_sets_response(&mut Cursor::new(b"MN\r\n".to_vec()), &mut line).is_ok());
        let e =
            read_sets_response(&mut Cursor::new(b"SERVER_ERROR out of memory\r\nMN\r\n".to_vec()), &mut line)
                .unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
        assert!(read_sets_response(&mut Cursor::new(b"NS\r\nMN\r\n".to_vec()), &mut line).is_err());
    }
}
