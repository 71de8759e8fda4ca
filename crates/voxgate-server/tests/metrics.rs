//! `GET /metrics` over a real socket: the content type, and an exposition a third-party
//! Prometheus parser (`prometheus-parse`) reads whole, with every family present from the
//! start (zero counts) and a Bridge turn's provider latency under `door="bridge"`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashSet;

use serde_json::json;
use support::{Running, WAIT, histogram_count, post_json, scalar, scrape};
use voxgate_server::Config;
use voxgate_server::metrics::{Door, ProviderKind, Stage};

#[tokio::test]
async fn metrics_over_http_parse_and_show_every_family_from_the_start() {
    tokio::time::timeout(WAIT * 3, async {
        let server = Running::start(Config::default()).await;
        let (content_type, fresh) = scrape(&server).await;
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");

        let families: HashSet<&str> = fresh.samples.iter().map(|s| s.metric.as_str()).collect();
        for door in Door::ALL {
            let d = [("door", door.label())];
            for stage in Stage::ALL {
                assert_eq!(histogram_count(&fresh, stage.metric_name(), &d), 0.0);
            }
            for kind in ["client", "mcp", "device", "action"] {
                let dk = [("door", door.label()), ("kind", kind)];
                assert_eq!(
                    histogram_count(&fresh, "voxgate_tool_call_seconds", &dk),
                    0.0
                );
                for outcome in ["ok", "error", "cancelled", "timeout"] {
                    let dko = [("door", door.label()), ("kind", kind), ("outcome", outcome)];
                    assert_eq!(scalar(&fresh, "voxgate_tool_calls_total", &dko), 0.0);
                }
            }
            for counter in [
                "voxgate_interruptions_total",
                "voxgate_false_interruptions_total",
                "voxgate_replies_cut_total",
                "voxgate_sessions_total",
                "voxgate_turns_total",
            ] {
                assert_eq!(scalar(&fresh, counter, &d), 0.0, "{counter}");
            }
            for provider in ProviderKind::ALL {
                let dp = [("door", door.label()), ("provider", provider.label())];
                assert_eq!(
                    histogram_count(&fresh, "voxgate_provider_latency_seconds", &dp),
                    0.0
                );
            }
            assert_eq!(
                histogram_count(&fresh, "voxgate_turn_server_added_seconds", &d),
                0.0
            );
        }
        for name in [
            "voxgate_sessions_active",
            "voxgate_dropped_frames_total",
            "voxgate_sessions_refused_total",
            "voxgate_scheduling_delay_seconds",
            "voxgate_speculations_total",
            "voxgate_speculative_requests_total",
            "voxgate_provider_failures_total",
            "voxgate_provider_timeouts_total",
            "voxgate_provider_fallbacks_total",
            "voxgate_webrtc_late_frames_total",
            "voxgate_webrtc_dropped_datagrams_total",
        ] {
            assert!(families.contains(name), "{name} missing");
        }
        for name in families
            .iter()
            .filter(|n| !n.ends_with("_sum") && !n.ends_with("_count"))
        {
            assert!(fresh.docs.contains_key(*name), "{name} has no HELP");
        }

        // A Bridge turn: its model latency is counted under the bridge door.
        let r = post_json(
            server.addr,
            "/api/message",
            &json!({"content": "hello", "channel": "web"}),
        )
        .await;
        assert_eq!(r.status, 200, "{r:?}");
        let (_, after) = scrape(&server).await;
        let llm = [("door", "bridge"), ("provider", "llm")];
        assert_eq!(
            histogram_count(&after, "voxgate_provider_latency_seconds", &llm),
            1.0
        );
        assert_eq!(
            scalar(&after, "voxgate_provider_latency_seconds_count", &llm),
            1.0
        );
        let realtime = [("door", "realtime"), ("provider", "llm")];
        assert_eq!(
            histogram_count(&after, "voxgate_provider_latency_seconds", &realtime),
            0.0
        );
        server.stop().await;
    })
    .await
    .unwrap();
}
