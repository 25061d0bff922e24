//! [`VersionProxy`]: a TCP proxy in front of a real `redis-server` that makes it report
//! another version in `INFO`, to test what a client does with a server too old (or too new)
//! for it when only one version is installed.

use std::io;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::probe;

/// A proxy on a free loopback port that forwards to `127.0.0.1:<upstream_port>` and rewrites
/// the `redis_version:` line of every `INFO` reply to the version it is given (the RESP bulk
/// length is written anew). Everything else passes unchanged, in both directions; a reply it
/// cannot parse is passed on as it is.
///
/// Scripts that call `INFO` inside Redis see the real version: only replies to the client are
/// rewritten.
///
/// It runs as tasks on the current tokio runtime and stops (closing every connection) when
/// dropped.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use lock_testkit::{RedisServer, VersionProxy};
/// let server = RedisServer::start()?;
/// let proxy = VersionProxy::start(server.port(), "6.0.16").await?;
/// let mut conn = redis::Client::open(proxy.url()).unwrap()
///     .get_multiplexed_async_connection().await.unwrap();
/// let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.unwrap();
/// assert!(info.contains("redis_version:6.0.16\r\n"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct VersionProxy {
    port: u16,
    version: Arc<Mutex<String>>,
    task: JoinHandle<()>,
}

impl VersionProxy {
    /// Binds a free loopback port and proxies to `127.0.0.1:<upstream_port>`, reporting
    /// `version` as `redis_version`.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub async fn start(upstream_port: u16, version: &str) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        crate::server::reserve_port(port);
        let version = Arc::new(Mutex::new(version.to_owned()));
        let task = tokio::spawn(accept_loop(listener, upstream_port, Arc::clone(&version)));
        Ok(Self {
            port,
            version,
            task,
        })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        probe::url(self.port)
    }

    /// The version `INFO` replies report from now on (connections already open too).
    pub fn set_version(&self, version: &str) {
        *self.version.lock().unwrap_or_else(|e| e.into_inner()) = version.to_owned();
    }
}

impl Drop for VersionProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its `JoinSet`, which aborts every connection task.
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream_port: u16, version: Arc<Mutex<String>>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        connections.spawn(connection(client, upstream_port, Arc::clone(&version)));
    }
}

async fn connection(mut client: TcpStream, upstream_port: u16, version: Arc<Mutex<String>>) {
    let Ok(mut upstream) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream_port)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let up = async {
        tokio::io::copy(&mut client_read, &mut upstream_write).await?;
        upstream_write.shutdown().await
    };
    let down = async {
        let mut pending = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            let n = upstream_read.read(&mut chunk).await?;
            if n == 0 {
                client_write.write_all(&pending).await?;
                return client_write.shutdown().await;
            }
            pending.extend_from_slice(&chunk[..n]);
            let mut out = Vec::with_capacity(pending.len());
            let mut at = 0;
            loop {
                match frame_len(&pending[at..]) {
                    Frame::Complete(len) => {
                        let frame = &pending[at..at + len];
                        let reported = version.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        match rewrite_info(frame, &reported) {
                            Some(rewritten) => out.extend_from_slice(&rewritten),
                            None => out.extend_from_slice(frame),
                        }
                        at += len;
                    }
                    Frame::Incomplete => break,
                    Frame::Invalid => {
                        // Not RESP as this parser knows it: pass everything on untouched.
                        out.extend_from_slice(&pending[at..]);
                        at = pending.len();
                        break;
                    }
                }
            }
            pending.drain(..at);
            client_write.write_all(&out).await?;
        }
    };
    let _ = tokio::try_join!(up, down);
}

/// How much of a buffer the first RESP value takes.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    Complete(usize),
    Incomplete,
    Invalid,
}

/// The length of the first RESP2/RESP3 value of `buf`.
fn frame_len(buf: &[u8]) -> Frame {
    let Some(&kind) = buf.first() else {
        return Frame::Incomplete;
    };
    let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Frame::Incomplete;
    };
    let header = &buf[1..line_end];
    let after_header = line_end + 2;
    let count = || -> Option<i64> { std::str::from_utf8(header).ok()?.parse().ok() };
    match kind {
        // Simple string, error, integer, null, double, boolean, big number.
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Frame::Complete(after_header),
        // Bulk string, bulk error, verbatim string.
        b'$' | b'!' | b'=' => match count() {
            Some(len) if len < 0 => Frame::Complete(after_header),
            Some(len) => {
                let end = after_header + len as usize + 2;
                if buf.len() < end {
                    Frame::Incomplete
                } else {
                    Frame::Complete(end)
                }
            }
            None => Frame::Invalid,
        },
        // Array, set, push; map and attribute hold pairs.
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let Some(n) = count() else {
                return Frame::Invalid;
            };
            if n < 0 {
                return Frame::Complete(after_header);
            }
            let n = if matches!(kind, b'%' | b'|') {
                n * 2
            } else {
                n
            };
            let mut at = after_header;
            for _ in 0..n {
                match frame_len(&buf[at..]) {
                    Frame::Complete(len) => at += len,
                    other => return other,
                }
            }
            Frame::Complete(at)
        }
        _ => Frame::Invalid,
    }
}

/// `frame` with its `redis_version:` line set to `version`, if it is a bulk (or verbatim)
/// string holding one: an `INFO` reply.
fn rewrite_info(frame: &[u8], version: &str) -> Option<Vec<u8>> {
    if !matches!(frame.first(), Some(b'$' | b'=')) {
        return None;
    }
    let start = frame.windows(2).position(|w| w == b"\r\n")? + 2;
    let body = std::str::from_utf8(frame.get(start..frame.len().checked_sub(2)?)?).ok()?;
    let line = body.find("redis_version:")?;
    let value = line + "redis_version:".len();
    let end = body[value..].find("\r\n").map_or(body.len(), |i| value + i);
    let body = format!("{}{version}{}", &body[..value], &body[end..]);
    let mut out = Vec::with_capacity(body.len() + 16);
    out.push(frame[0]);
    out.extend_from_slice(format!("{}\r\n", body.len()).as_bytes());
    out.extend_from_slice(body.as_bytes());
    out.extend_from_slice(b"\r\n");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_measured_across_chunks() {
        assert_eq!(frame_len(b"+OK\r\n:1\r\n"), Frame::Complete(5));
        assert_eq!(frame_len(b"$3\r\nabc\r\n"), Frame::Complete(9));
        assert_eq!(frame_len(b"$3\r\nab"), Frame::Incomplete);
        assert_eq!(frame_len(b"$-1\r\n"), Frame::Complete(5));
        assert_eq!(frame_len(b"*2\r\n$1\r\na\r\n:5\r\n"), Frame::Complete(15));
        assert_eq!(frame_len(b"*2\r\n$1\r\na\r\n"), Frame::Incomplete);
        assert_eq!(frame_len(b"%1\r\n+a\r\n+b\r\n"), Frame::Complete(12));
        assert_eq!(frame_len(b"*"), Frame::Incomplete);
        assert_eq!(frame_len(b"?x\r\n"), Frame::Invalid);
    }

    #[test]
    fn the_version_line_is_rewritten_with_a_correct_length() {
        let body = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
        let frame = format!("${}\r\n{body}\r\n", body.len());
        let rewritten = rewrite_info(frame.as_bytes(), "6.0.16").unwrap();
        let expected = "# Server\r\nredis_version:6.0.16\r\nredis_mode:standalone\r\n";
        assert_eq!(
            String::from_utf8(rewritten).unwrap(),
            format!("${}\r\n{expected}\r\n", expected.len())
        );
        assert_eq!(rewrite_info(b"$3\r\nabc\r\n", "6.0.16"), None);
        assert_eq!(rewrite_info(b"+redis_version:1\r\n", "6.0.16"), None);
    }
}
