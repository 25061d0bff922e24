//! The demo's HTTP client: one purchase, retried after `Retry-After` (and some jitter) while
//! the answer is `409 busy`, timed on the instances' clock ([`now_ns`]).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use inventory::ErrorBody;

use crate::recorder::{now_ns, PURCHASE_HEADER};

/// The demo's HTTP client.
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A purchase still busy after this many answers is given up (a bound, not a tuning knob: at
/// 1 to 2 s per `Retry-After` it is more than a minute).
const MAX_TRIES: u32 = 50;

/// How a purchase ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// `200`: an order was taken.
    Sold,
    /// `409 sold_out`.
    SoldOut,
    /// `409 busy` on every try (the layer that does not wait, `MAX_TRIES` times).
    Busy,
    /// `409 stale_fence`: the fencing token refused the write.
    Stale,
    /// Anything else (lock lost, Redis, database, HTTP).
    Failed,
}

/// One purchase as the client saw it; timestamps are [`now_ns`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPurchase {
    /// The purchase's number in its round, sent as [`PURCHASE_HEADER`].
    pub id: u64,
    /// When the first request was sent.
    pub sent: u64,
    /// When the final answer arrived.
    pub answered: u64,
    /// `409 busy` answers before the final one, each followed by a wait of `Retry-After`
    /// (the final answer is not counted here, even when it is busy too).
    pub busy_answers: u32,
    /// Nanoseconds spent waiting for `Retry-After` to pass.
    pub retry_wait: u64,
    /// The final answer.
    pub answer: Answer,
    /// What failed, for [`Answer::Failed`].
    pub error: Option<String>,
}

impl ClientPurchase {
    /// The latency the client saw, retries included, in nanoseconds.
    pub fn latency(&self) -> u64 {
        self.answered.saturating_sub(self.sent)
    }
}

/// Buys one unit at `path` on `addr`, honouring `Retry-After` while the answer is busy.
pub(crate) async fn purchase(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    id: u64,
) -> ClientPurchase {
    let sent = now_ns();
    let mut busy_answers = 0;
    let mut retry_wait = 0;
    let headers = [(PURCHASE_HEADER, id.to_string())];
    let (answer, error) = loop {
        let reply = send(client, Method::POST, addr, path, &headers, Vec::new()).await;
        match classify(&reply) {
            (Answer::Busy, _) if busy_answers + 1 < MAX_TRIES => {
                busy_answers += 1;
                // At least what the header says (whole seconds; a second without one), plus
                // up to a second of our own jitter: whole seconds bring every client refused
                // together back together, to be refused together again (measured: 100
                // purchases of 100 in stock took 51 s without it, 2 sales a second).
                let jitter = Duration::from_millis(rand::random_range(0..1000));
                let wait = Duration::from_secs(reply.retry_after.unwrap_or(1)) + jitter;
                let before = now_ns();
                tokio::time::sleep(wait).await;
                retry_wait += now_ns().saturating_sub(before);
            }
            (Answer::Busy, _) => break (Answer::Busy, None),
            other => break other,
        }
    };
    ClientPurchase {
        id,
        sent,
        answered: now_ns(),
        busy_answers,
        retry_wait,
        answer,
        error,
    }
}

/// Sorts an answer; the message of a failure.
fn classify(reply: &Reply) -> (Answer, Option<String>) {
    let Some(status) = reply.status else {
        return (Answer::Failed, Some(reply.body.clone()));
    };
    if status == StatusCode::OK {
        return (Answer::Sold, None);
    }
    // The lock was busy: lock-tower's answer, with when to come back.
    if status == StatusCode::CONFLICT && reply.retry_after.is_some() {
        return (Answer::Busy, None);
    }
    match serde_json::from_str::<ErrorBody>(&reply.body) {
        Ok(ErrorBody { error, message }) => match error.as_str() {
            "sold_out" => (Answer::SoldOut, None),
            "stale_fence" => (Answer::Stale, None),
            _ => (Answer::Failed, Some(format!("{status}: {message}"))),
        },
        Err(_) => (
            Answer::Failed,
            Some(format!("{status}: {}", reply.body.trim())),
        ),
    }
}

/// An answer: `status` is `None` when there was none, and `body` says why.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: Option<StatusCode>,
    pub(crate) retry_after: Option<u64>,
    pub(crate) body: String,
}

/// Sends one request and reads the whole answer.
pub(crate) async fn send(
    client: &HttpClient,
    method: Method,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Reply {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header(hyper::header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let failed = |body: String| Reply {
        status: None,
        retry_after: None,
        body,
    };
    let request = match request.body(Full::new(Bytes::from(body))) {
        Ok(request) => request,
        Err(error) => return failed(format!("{addr}{path}: bad request: {error}")),
    };
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>(Reply {
            status: Some(status),
            retry_after,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    match tokio::time::timeout(Duration::from_secs(60), exchange).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(error)) => failed(format!("{addr}: {error}")),
        Err(_) => failed(format!("{addr}: no answer within 60 s")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).ok(),
            retry_after: None,
            body: body.to_owned(),
        }
    }

    #[test]
    fn answers_are_sorted_by_their_error_code() {
        assert_eq!(classify(&reply(200, "{}")).0, Answer::Sold);
        let busy = Reply {
            retry_after: Some(1),
            ..reply(409, "inventory:42 is locked")
        };
        assert_eq!(classify(&busy).0, Answer::Busy);
        let stale = r#"{"error":"stale_fence","message":"stale"}"#;
        assert_eq!(classify(&reply(409, stale)).0, Answer::Stale);
        let lost = r#"{"error":"lock_lost","message":"lost"}"#;
        let (answer, error) = classify(&reply(503, lost));
        assert_eq!(answer, Answer::Failed);
        assert!(error.is_some_and(|e| e.contains("lost")));
        assert_eq!(classify(&reply(500, "oops")).0, Answer::Failed);
    }
}
