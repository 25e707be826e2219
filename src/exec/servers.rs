//! A pool of HTTP servers that take JSON POSTs, shared by the remote
//! sandbox and the HTTP reward terms: each request goes to the least busy
//! server within its concurrency, carries a bearer token when one is set,
//! and one that got no answer (no connection, a deadline, 408, 429 or 5xx)
//! is tried again after a backoff on the next server. Other 4xx answers are
//! refusals: trying again cannot help.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// First backoff; doubled each try, with jitter, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Why a request got no usable answer.
pub enum Failure {
    /// No answer, or the server said it could not run it now: try again.
    Retry(String),
    /// The server refused the request itself: trying again cannot help.
    Refused(String),
}

impl Failure {
    pub fn into_message(self) -> String {
        match self {
            Failure::Retry(e) | Failure::Refused(e) => e,
        }
    }
}

/// Counters of a server pool, for the logs and the metrics.
#[derive(Debug, Default)]
pub struct RemoteStats {
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub unanswered: AtomicU64,
}

/// The servers and their busy slots.
pub struct Servers {
    urls: Vec<String>,
    concurrency: usize,
    retries: u32,
    token: Option<String>,
    agent: ureq::Agent,
    busy: Mutex<Vec<usize>>,
    freed: Condvar,
    next: AtomicUsize,
    pub stats: RemoteStats,
}

impl Servers {
    /// `urls` (a trailing `/` dropped), `concurrency` requests in flight per
    /// server, `retries` tries after the first, and the bearer token in the
    /// environment variable `token_env` (unset or blank: none).
    pub fn new(urls: &[String], concurrency: usize, retries: u32, token_env: &str) -> Servers {
        let token = std::env::var(token_env)
            .ok()
            .filter(|t| !t.trim().is_empty());
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        Servers {
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            concurrency: concurrency.max(1),
            retries,
            token,
            agent,
            busy: Mutex::new(vec![0; urls.len()]),
            freed: Condvar::new(),
            next: AtomicUsize::new(0),
            stats: RemoteStats::default(),
        }
    }

    /// The servers' URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Requests the servers take at once, all together.
    pub fn capacity(&self) -> usize {
        self.urls.len() * self.concurrency
    }

    /// One HTTP exchange with server `i`.
    pub fn call(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<&str>,
        deadline: Duration,
    ) -> Result<String, Failure> {
        let url = format!("{}{path}", self.urls[i]);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let result = if method == "GET" {
            let mut req = self.agent.get(&url);
            if let Some(t) = &self.token {
                req = req.header("Authorization", &format!("Bearer {t}"));
            }
            req.config().timeout_global(Some(deadline)).build().call()
        } else {
            let mut req = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json");
            if let Some(t) = &self.token {
                req = req.header("Authorization", &format!("Bearer {t}"));
            }
            req.config()
                .timeout_global(Some(deadline))
                .build()
                .send(body.unwrap_or(""))
        };
        let mut resp = result.map_err(|e| Failure::Retry(format!("{method} {url}: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| {
                Failure::Retry(format!(
                    "{method} {url}: HTTP {status}, reading the body: {e}"
                ))
            })?;
        match status {
            200..=299 => Ok(text),
            // Busy, overloaded, restarting or behind a gateway that timed out.
            408 | 429 | 500..=599 => Err(Failure::Retry(format!(
                "{method} {url}: HTTP {status}: {}",
                excerpt(&text)
            ))),
            _ => Err(Failure::Refused(format!(
                "{method} {url}: HTTP {status}: {}",
                excerpt(&text)
            ))),
        }
    }

    /// Takes a request slot on the least busy server, preferring one other
    /// than `avoid` (the one that just failed).
    fn acquire(&self, avoid: Option<usize>) -> usize {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = busy.len();
            let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
            let pick = (0..n)
                .map(|k| (start + k) % n)
                .filter(|&i| busy[i] < self.concurrency)
                .min_by_key(|&i| (Some(i) == avoid && n > 1, busy[i]));
            if let Some(i) = pick {
                busy[i] += 1;
                return i;
            }
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, i: usize) {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy[i] -= 1;
        self.freed.notify_one();
    }

    /// POSTs `body` to `path` until one server answers, trying again on
    /// the next server after a backoff; `Err` carries every failure.
    pub fn post(&self, path: &str, body: &str, deadline: Duration) -> Result<String, String> {
        let mut errors = Vec::new();
        let mut avoid = None;
        for attempt in 0..=self.retries {
            if attempt > 0 {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(backoff(attempt));
            }
            let i = self.acquire(avoid);
            let r = self.call(i, "POST", path, Some(body), deadline);
            self.release(i);
            match r {
                Ok(text) => return Ok(text),
                Err(Failure::Refused(e)) => {
                    errors.push(e);
                    break;
                }
                Err(Failure::Retry(e)) => {
                    errors.push(e);
                    avoid = Some(i);
                }
            }
        }
        self.stats.unanswered.fetch_add(1, Ordering::Relaxed);
        Err(errors.join("; then "))
    }
}

/// The wait before try `attempt` (1-based): exponential with ±25% jitter.
pub fn backoff(attempt: u32) -> Duration {
    let base = FIRST_BACKOFF
        .saturating_mul(1 << attempt.min(10).saturating_sub(1))
        .min(MAX_BACKOFF);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = 0.75 + 0.5 * (nanos % 1000) as f64 / 1000.0;
    base.mul_f64(jitter)
}

/// The first characters of a body, on one line.
pub fn excerpt(body: &str) -> String {
    crate::text::body_excerpt(body, 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b1 = backoff(1);
        let b3 = backoff(3);
        assert!(
            b1 >= Duration::from_millis(150) && b1 <= Duration::from_millis(250),
            "{b1:?}"
        );
        assert!(
            b3 >= Duration::from_millis(600) && b3 <= Duration::from_millis(1000),
            "{b3:?}"
        );
        assert!(backoff(30) <= MAX_BACKOFF.mul_f64(1.25));
    }
}
