//! The perception bus across instances: events published on one instance are appended to one
//! Redis stream (`<prefix>:perception`, trimmed to about `perception_stream_len` entries) and
//! every instance reads the stream and publishes the others' events on its own bus, tagged with
//! the instance they came from.
//!
//! Each instance reads with its own cursor (`XREAD` from the last id it saw) rather than a
//! consumer group: every instance must see every event (a group would share them out), and a
//! group per instance would outlive instances with random ids. The cursor gives the same
//! guarantee: when the reader's connection drops and comes back, it goes on from where it was,
//! so nothing still in the stream is lost. A restarted (empty) Redis starts ids again, which the
//! reader notices and follows. Events published while Redis is unreachable reach this
//! instance's own subscribers only (logged).

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands as _;
use redis::streams::{StreamMaxlen, StreamReadOptions, StreamReadReply};
use tokio::sync::{mpsc, watch};

use super::{BACKOFF_MAX, BACKOFF_MIN, Cluster, stopped};
use crate::bridge::perception::{PerceptionBus, PerceptionEvent};

/// Events waiting to be appended; past it the bus logs and keeps them local.
pub(crate) const OUTBOX: usize = 4096;
/// How long one blocking read waits for new entries.
const BLOCK: Duration = Duration::from_secs(2);
/// Entries read at once.
const BATCH: usize = 256;

/// Appends events published here to the stream, several at once when they queue up.
pub(crate) async fn append(
    cluster: Arc<Cluster>,
    mut outbox: mpsc::Receiver<Arc<PerceptionEvent>>,
    mut stop: watch::Receiver<bool>,
) {
    let key = cluster.perception_key();
    let len = cluster.stream_len();
    let mut batch = Vec::with_capacity(64);
    loop {
        tokio::select! {
            n = outbox.recv_many(&mut batch, 64) => if n == 0 { return },
            () = stopped(&mut stop) => return,
        }
        let mut tagged = Vec::with_capacity(batch.len());
        for e in batch.drain(..) {
            let mut e = (*e).clone();
            e.instance = Some(cluster.instance().to_owned());
            tagged.push(serde_json::to_string(&e).unwrap_or_default());
        }
        let k = key.clone();
        let n = tagged.len();
        if let Err(e) = cluster
            .op("perception_append", async move |c| {
                let mut pipe = redis::pipe();
                for json in &tagged {
                    pipe.xadd_maxlen(&k, StreamMaxlen::Approx(len), "*", &[("event", json)])
                        .ignore();
                }
                pipe.query_async::<()>(c).await
            })
            .await
        {
            tracing::warn!(events = n, error = %e, "perception events not shared with the cluster");
        }
    }
}

/// Reads the stream and publishes the other instances' events on `bus`.
pub(crate) async fn read(
    cluster: Arc<Cluster>,
    bus: Arc<PerceptionBus>,
    mut stop: watch::Receiver<bool>,
) {
    let key = cluster.perception_key();
    // The last id seen; `None` until the first connection.
    let mut last: Option<String> = None;
    let mut backoff = BACKOFF_MIN;
    loop {
        let conn = tokio::select! {
            c = cluster.dedicated() => c,
            () = stopped(&mut stop) => return,
        };
        match conn {
            Ok(mut conn) => {
                backoff = BACKOFF_MIN;
                let newest = newest_id(&mut conn, &key).await;
                match &last {
                    // The first connection: only what is published from now on.
                    None => last = Some(newest.unwrap_or_else(|| "0-0".into())),
                    // Redis came back empty (ids start again): read the new stream whole.
                    Some(id) if newest.is_none_or(|n| id_lt(&n, id)) => {
                        last = Some("0-0".into());
                    }
                    Some(_) => {}
                }
                loop {
                    let from = last.clone().unwrap_or_else(|| "0-0".into());
                    let opts = StreamReadOptions::default()
                        .block(usize::try_from(BLOCK.as_millis()).unwrap_or(2000))
                        .count(BATCH);
                    let (keys, ids) = ([key.as_str()], [from.as_str()]);
                    let reading =
                        conn.xread_options::<_, _, Option<StreamReadReply>>(&keys, &ids, &opts);
                    let read = tokio::select! {
                        r = tokio::time::timeout(BLOCK * 2, reading) => r,
                        () = stopped(&mut stop) => return,
                    };
                    let reply = match read {
                        Ok(Ok(r)) => r,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "perception stream read failed");
                            break;
                        }
                        Err(_) => {
                            tracing::debug!("perception stream read timed out");
                            break;
                        }
                    };
                    for stream in reply.map(|r| r.keys).unwrap_or_default() {
                        for entry in stream.ids {
                            last = Some(entry.id.clone());
                            let Some(json) = entry.get::<String>("event") else {
                                continue;
                            };
                            match read_entry(&json) {
                                Ok(e) if e.instance.as_deref() != Some(cluster.instance()) => {
                                    bus.publish(e);
                                }
                                Ok(_) => {}
                                Err(e) => {
                                    tracing::warn!(error = %e, "perception stream entry ignored");
                                }
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "perception stream connect failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stopped(&mut stop) => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Largest stream entry read.
const MAX_ENTRY_BYTES: usize = 64 * 1024;

/// Reads a stream entry as another instance's event, held to the bounds of an event published
/// here (`PerceptionEvent::from_value`), its instance id to the bounds of `[cluster]
/// instance_id`.
pub(crate) fn read_entry(json: &str) -> Result<PerceptionEvent, String> {
    if json.len() > MAX_ENTRY_BYTES {
        return Err(format!("an entry of {} bytes", json.len()));
    }
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let origin = serde_json::from_value(v["origin"].clone()).map_err(|e| e.to_string())?;
    let instance = v["instance"]
        .as_str()
        .filter(|i| !i.is_empty() && i.len() <= 64)
        .ok_or("`instance` (the publishing instance) is required")?
        .to_owned();
    let mut event = PerceptionEvent::from_value(v, None, None, origin).map_err(|e| e.0)?;
    event.instance = Some(instance);
    Ok(event)
}

/// The id of the stream's newest entry, if any.
async fn newest_id(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    let r: redis::streams::StreamRangeReply = conn.xrevrange_count(key, "+", "-", 1).await.ok()?;
    r.ids.into_iter().next().map(|e| e.id)
}

/// Whether stream id `a` is before `b` (`ms-seq`, compared as numbers).
fn id_lt(a: &str, b: &str) -> bool {
    let parse = |s: &str| {
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parse(a) < parse(b)
}

#[cfg(test)]
mod tests {
    use super::{id_lt, read_entry};

    #[test]
    fn stream_ids_compare_as_numbers() {
        assert!(id_lt("9-0", "10-0"));
        assert!(id_lt("10-2", "10-10"));
        assert!(!id_lt("10-0", "10-0"));
        assert!(!id_lt("11-0", "10-99"));
    }

    #[test]
    fn stream_entries_are_held_to_the_bounds_of_a_local_event() {
        let ok = r#"{"name":"face_detected","data":{"who":"ada"},"device_id":"cam-1","ts":1.5,"origin":"http","instance":"a"}"#;
        let e = read_entry(ok).unwrap();
        assert_eq!(
            (e.name.as_str(), e.instance.as_deref()),
            ("face_detected", Some("a"))
        );
        for bad in [
            r#"{"name":"","device_id":"cam-1","origin":"http","instance":"a"}"#.to_owned(),
            r#"{"name":"x","device_id":"cam-1","origin":"http"}"#.to_owned(),
            r#"{"name":"x","device_id":"cam-1","origin":"martian","instance":"a"}"#.to_owned(),
            format!(
                r#"{{"name":"{}","device_id":"d","origin":"http","instance":"a"}}"#,
                "n".repeat(65)
            ),
            "[1]".to_owned(),
        ] {
            assert!(read_entry(&bad).is_err(), "{bad}");
        }
    }
}
