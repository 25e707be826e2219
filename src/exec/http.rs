//! The little HTTP/1.1 the sandbox service needs, on `std::net`: one
//! request per connection (every answer says `Connection: close`), a
//! request head and body read under size limits and a read timeout, and a
//! JSON or text answer. Keeping no connection alive means no idle connection
//! holds a thread and no client ever reuses a connection the server has
//! given up on (tiny_http did both under load: a client's request sat unread
//! on a kept-alive connection until the client's deadline).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// Largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The path, without the query string and without a trailing `/`.
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// `Content-Length`, when given.
    pub content_length: Option<usize>,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request could not be read: the status to answer and the reason
/// (`None`: the connection is gone, answer nothing).
#[derive(Debug, PartialEq, Eq)]
pub struct ReadFailure(pub Option<(u16, String)>);

/// Reads a request head from `conn`.
pub fn read_head(conn: &mut BufReader<TcpStream>) -> Result<Request, ReadFailure> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = (&mut *conn)
            .take((MAX_HEAD_BYTES + 1 - head.len().min(MAX_HEAD_BYTES)) as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    ReadFailure(Some((408, "the request was not sent in time".into())))
                }
                _ => ReadFailure(None),
            })?;
        if n == 0 {
            return Err(ReadFailure(if head.is_empty() {
                None
            } else {
                Some((400, "the connection ended inside the request head".into()))
            }));
        }
        head.extend_from_slice(&line);
        if head.len() > MAX_HEAD_BYTES {
            return Err(ReadFailure(Some((
                431,
                format!("request head over {MAX_HEAD_BYTES} bytes"),
            ))));
        }
        if line == b"\r\n" || line == b"\n" {
            break;
        }
    }
    parse_head(&head).map_err(|why| ReadFailure(Some((400, why))))
}

/// Parses a request line and headers.
pub fn parse_head(head: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8".to_owned())?;
    let mut lines = text.split('\n').map(|l| l.trim_end_matches('\r'));
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("malformed request line {:?}", excerpt(first)));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(format!("malformed request line {:?}", excerpt(first)));
    }
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| format!("malformed header line {:?}", excerpt(line)))?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let mut req = Request {
        method: method.to_owned(),
        path: target
            .split('?')
            .next()
            .unwrap_or("")
            .trim_end_matches('/')
            .to_owned(),
        headers,
        content_length: None,
    };
    if let Some(v) = req.header("Content-Length") {
        req.content_length = Some(
            v.parse()
                .map_err(|_| format!("Content-Length {:?} is not a number", excerpt(v)))?,
        );
    }
    Ok(req)
}

/// Reads the body announced by `req` (at most `limit` bytes), answering
/// `Expect: 100-continue` first.
pub fn read_body(
    conn: &mut BufReader<TcpStream>,
    req: &Request,
    limit: usize,
) -> Result<Vec<u8>, ReadFailure> {
    if req
        .header("Transfer-Encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        return Err(ReadFailure(Some((
            411,
            "chunked bodies are not read here: send Content-Length".into(),
        ))));
    }
    let n = req.content_length.unwrap_or(0);
    if n > limit {
        return Err(ReadFailure(Some((
            413,
            format!("request body over the limit of {limit} bytes"),
        ))));
    }
    if n > 0
        && req
            .header("Expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        conn.get_mut()
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|_| ReadFailure(None))?;
    }
    let mut body = vec![0; n];
    conn.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            ReadFailure(Some((408, "the request body was not sent in time".into())))
        }
        io::ErrorKind::UnexpectedEof => ReadFailure(Some((
            400,
            format!("the connection ended inside the {n}-byte body"),
        ))),
        _ => ReadFailure(None),
    })?;
    Ok(body)
}

/// Writes a whole answer and ends the exchange.
pub fn respond(
    conn: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    retry_after: bool,
) {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    if retry_after {
        head.push_str("Retry-After: 1\r\n");
    }
    head.push_str("\r\n");
    // A client that went away is not the server's problem.
    let _ = conn
        .write_all(head.as_bytes())
        .and_then(|()| conn.write_all(body))
        .and_then(|()| conn.flush());
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn excerpt(s: &str) -> String {
    crate::text::clip(s, 80, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_parses_with_its_path_headers_and_length() {
        let r = parse_head(
            b"POST /run_code/?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 12\r\nAuthorization:  Bearer t \r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/run_code"));
        assert_eq!(r.content_length, Some(12));
        assert_eq!(r.header("authorization"), Some("Bearer t"));
    }

    #[test]
    fn malformed_heads_say_what_is_wrong() {
        for (head, why) in [
            (&b"GARBAGE\r\n\r\n"[..], "malformed request line"),
            (b"GET / HTTP/2\r\n\r\n", "malformed request line"),
            (
                b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
                "malformed header line",
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n",
                "not a number",
            ),
            (b"GET /\xff HTTP/1.1\r\n\r\n", "not UTF-8"),
        ] {
            let e = parse_head(head).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }
}
