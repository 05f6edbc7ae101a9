//! The two servers' connections behind [`Backend`](super::Backend): memcached (text multi-get, quiet meta
//! sets) and our data plane (GET_BATCH / PUT_BATCH), each checking every hit's value against its key.

use super::memcache;
use super::{stamped, Backend, Result, ServerBenchError, VALUE_SIZE};
use crate::daemon::BenchVm;
use dd_engine::{Key, PoolId, PutOutcome};
use dd_proto::{KeyList, Request, Response};
use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};

enum Pending {
    Get(Vec<u64>),
    Put(usize),
}

/// One pipelined connection to memcached.
pub struct MemcachedConn {
    rd: BufReader<TcpStream>,
    wbuf: Vec<u8>,
    pending: VecDeque<Pending>,
    line: Vec<u8>,
    data: Vec<u8>,
}

impl MemcachedConn {
    pub fn connect(addr: SocketAddr) -> Result<MemcachedConn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Ok(MemcachedConn {
            rd: BufReader::with_capacity(256 * 1024, s),
            wbuf: Vec::with_capacity(256 * 1024),
            pending: VecDeque::new(),
            line: Vec::new(),
            data: Vec::new(),
        })
    }
}

impl Backend for MemcachedConn {
    fn send_put(&mut self, keys: &[u64], vals: &[u8]) -> Result<()> {
        memcache::encode_sets(keys, vals, VALUE_SIZE, &mut self.wbuf);
        self.pending.push_back(Pending::Put(keys.len()));
        Ok(())
    }

    fn send_get(&mut self, keys: &[u64]) -> Result<()> {
        memcache::encode_get(keys, &mut self.wbuf);
        self.pending.push_back(Pending::Get(keys.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.rd.get_mut().write_all(&self.wbuf)?;
            self.wbuf.clear();
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<usize> {
        self.flush()?;
        match self.pending.pop_front() {
            None => Err(ServerBenchError::Protocol("recv with nothing outstanding".into())),
            Some(Pending::Put(n)) => {
                memcache::read_sets_response(&mut self.rd, &mut self.line)?;
                Ok(n)
            }
            Some(Pending::Get(keys)) => {
                memcache::read_get_response(&mut self.rd, &mut self.line, &mut self.data, |k, v| {
                    if keys.contains(&k) && stamped(v, k) {
                        Ok(())
                    } else {
                        Err(ServerBenchError::Corrupt { server: "memcached", key: k })
                    }
                })
            }
        }
    }
}

/// One pipelined data-plane connection to our daemon, on one pool.
pub struct DdConn {
    client: dd_client::Client,
    pool: PoolId,
    pending: VecDeque<Pending>,
    keybuf: Vec<Key>,
}

/// The data-plane key of page key `k`: 64 pages per object, like consecutive pages of files.
fn dd_key(k: u64) -> Key {
    Key::new(k >> 6, k & 63)
}

impl DdConn {
    /// A connection over TCP, under TLS when `tls` is given.
    pub fn connect(
        addr: SocketAddr,
        tls: Option<&dd_client::TlsClient>,
        vm: &BenchVm,
        pool: PoolId,
    ) -> Result<DdConn> {
        let client = match tls {
            Some(t) => dd_client::Client::connect_tls(&addr.to_string(), t, vm.id, &vm.data_token)?,
            None => dd_client::Client::connect_tcp(addr, vm.id, &vm.data_token)?,
        };
        Ok(DdConn { client, pool, pending: VecDeque::new(), keybuf: Vec::new() })
    }

    fn keys(&mut self, keys: &[u64]) {
        self.keybuf.clear();
        self.keybuf.extend(keys.iter().map(|k| dd_key(*k)));
    }
}

impl Backend for DdConn {
    fn send_put(&mut self, keys: &[u64], vals: &[u8]) -> Result<()> {
        self.keys(keys);
        self.client.send(&Request::PutBatch {
            pool: self.pool,
            keys: KeyList::Keys(&self.keybuf),
            pages: vals,
        });
        self.pending.push_back(Pending::Put(keys.len()));
        Ok(())
    }

    fn send_get(&mut self, keys: &[u64]) -> Result<()> {
        self.keys(keys);
        self.client.send(&Request::GetBatch { pool: self.pool, keys: KeyList::Keys(&self.keybuf) });
        self.pending.push_back(Pending::Get(keys.to_vec()));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(self.client.flush()?)
    }

    fn recv(&mut self) -> Result<usize> {
        let (_, resp) = self.client.recv()?;
        let pending = self
            .pending
            .pop_front()
            .ok_or_else(|| ServerBenchError::Protocol("recv with nothing outstanding".into()))?;
        match (pending, resp) {
            (Pending::Put(n), Response::PutBatch(outs)) if outs.len() == n => {
                Ok(outs.iter().filter(|o| matches!(o, PutOutcome::Stored(_))).count())
            }
            (Pending::Get(keys), Response::GetBatch { hits, pages }) if hits.len() == keys.len() => {
                let mut src = pages.chunks_exact(VALUE_SIZE);
                let mut n = 0;
                for (k, _) in keys.iter().zip(&hits).filter(|(_, h)| **h) {
                    let v =
                        src.next().ok_or(ServerBenchError::Corrupt { server: "doubledecker", key: *k })?;
                    if !stamped(v, *k) {
                        return Err(ServerBenchError::Corrupt { server: "doubledecker", key: *k });
                    }
                    n += 1;
                }
                Ok(n)
            }
            (_, Response::Error { status, message }) => {
                Err(dd_client::ClientError::Server { status, message }.into())
            }
            (_, other) => {
                Err(ServerBenchError::Protocol(format!("unexpected answer {:.200}", format!("{other:?}"))))
            }
        }
    }
}
