//! Counts and latencies of this instance's Redis operations, for `/admin/cluster` and the
//! scale-out figure (how many operations a turn costs and what they add).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};

/// Latencies kept per operation for percentiles: the most recent ones.
const KEPT: usize = 4096;

#[derive(Debug, Default)]
struct Op {
    count: u64,
    errors: u64,
    /// The last [`KEPT`] latencies in microseconds, a ring.
    recent: Vec<u32>,
    next: usize,
}

/// Per-operation counts and recent latencies.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    ops: Mutex<BTreeMap<&'static str, Op>>,
}

impl Stats {
    /// Records one operation.
    pub(crate) fn record(&self, op: &'static str, took: Duration, ok: bool) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let mut ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner);
        let o = ops.entry(op).or_default();
        o.count += 1;
        if !ok {
            o.errors += 1;
        }
        if o.recent.len() < KEPT {
            o.recent.push(micros);
        } else {
            o.recent[o.next] = micros;
            o.next = (o.next + 1) % KEPT;
        }
    }

    /// Per operation: count, errors, and p50 / p99 / max of the recent latencies in µs.
    pub(crate) fn describe(&self) -> Value {
        let ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = serde_json::Map::new();
        for (name, o) in ops.iter() {
            let mut sorted = o.recent.clone();
            sorted.sort_unstable();
            let pct = |p: f64| -> Option<u32> {
                if sorted.is_empty() {
                    return None;
                }
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss,
                    reason = "an index into at most KEPT entries"
                )]
                let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
                sorted.get(i).copied()
            };
            out.insert(
                (*name).to_owned(),
                json!({
                    "count": o.count,
                    "errors": o.errors,
                    "p50_us": pct(0.5),
                    "p99_us": pct(0.99),
                    "max_us": sorted.last(),
                }),
            );
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_recent_latencies() {
        let s = Stats::default();
        for i in 1..=100 {
            s.record("claim", Duration::from_micros(i), i != 100);
        }
        let d = s.describe();
        assert_eq!(d["claim"]["count"], 100);
        assert_eq!(d["claim"]["errors"], 1);
        assert_eq!(d["claim"]["p50_us"], 51);
        assert_eq!(d["claim"]["p99_us"], 99);
        assert_eq!(d["claim"]["max_us"], 100);
        for _ in 0..KEPT * 2 {
            s.record("claim", Duration::from_micros(7), true);
        }
        assert_eq!(s.describe()["claim"]["max_us"], 7);
    }
}
