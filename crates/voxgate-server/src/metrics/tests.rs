use std::collections::{HashMap, HashSet};

use prometheus_parse::{LineInfo, Scrape, Value};

use super::*;

fn has_line(text: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
}

#[test]
fn counts_render_as_prometheus_text() {
    let m = Metrics::new();
    {
        let _g = m.session(Door::Realtime);
        assert_eq!(m.active_sessions(Door::Realtime), 1);
        m.turn(Door::Realtime);
        m.dropped(Door::Realtime, Direction::Downlink, 3);
        m.latency(Door::Xiaozhi, ProviderKind::Tts, Duration::from_millis(250));
        let mut s = voxgate_engine::SpeculationStats::default();
        s.started = 2;
        s.discarded = 1;
        s.requests = 3;
        s.requests_cancelled = 2;
        m.speculation(Door::Xiaozhi, &s);
    }
    assert_eq!(m.active_sessions(Door::Realtime), 0);
    assert_eq!(m.turns(Door::Realtime), 1);
    assert_eq!(m.speculations(Door::Xiaozhi, 0), 2);
    assert_eq!(m.speculations(Door::Xiaozhi, 7), 0);
    let text = m.render();
    for line in [
        "# TYPE voxgate_sessions_total counter",
        "voxgate_sessions_total{door=\"realtime\"} 1",
        "voxgate_sessions_active{door=\"realtime\"} 0",
        "voxgate_turns_total{door=\"realtime\"} 1",
        "voxgate_dropped_frames_total{door=\"realtime\",direction=\"downlink\"} 3",
        "voxgate_dropped_frames_total{door=\"realtime\",direction=\"uplink\"} 0",
        "# TYPE voxgate_provider_latency_seconds histogram",
        "voxgate_provider_latency_seconds_sum{door=\"xiaozhi\",provider=\"tts\"} 0.25",
        "voxgate_provider_latency_seconds_count{door=\"xiaozhi\",provider=\"tts\"} 1",
        "voxgate_provider_latency_seconds_bucket{door=\"xiaozhi\",provider=\"tts\",le=\"0.2\"} 0",
        "voxgate_provider_latency_seconds_bucket{door=\"xiaozhi\",provider=\"tts\",le=\"0.3\"} 1",
        "voxgate_provider_latency_seconds_count{door=\"realtime\",provider=\"tts\"} 0",
        "voxgate_speculations_total{door=\"xiaozhi\",outcome=\"started\"} 2",
        "voxgate_speculations_total{door=\"xiaozhi\",outcome=\"adopted\"} 0",
        "voxgate_speculative_requests_total{door=\"xiaozhi\",outcome=\"cancelled\"} 2",
        "voxgate_speculative_requests_total{door=\"realtime\",outcome=\"cancelled\"} 0",
    ] {
        has_line(&text, line);
    }
}

#[test]
fn refusals_and_scheduling_delay_render() {
    let m = Metrics::new();
    m.refused(Door::Xiaozhi, RefusalReason::CapacityDoor);
    m.refused(Door::Xiaozhi, RefusalReason::CapacityDoor);
    m.refused(Door::Mcp, RefusalReason::HandshakeRate);
    m.set_scheduling_delay(Duration::from_micros(12_500));
    assert_eq!(
        m.refused_sessions(Door::Xiaozhi, RefusalReason::CapacityDoor),
        2
    );
    assert_eq!(m.scheduling_delay(), Duration::from_micros(12_500));
    m.set_scheduling_delay(Duration::from_micros(50_001));
    assert_eq!(m.scheduling_delay(), Duration::from_micros(50_001));
    m.set_scheduling_delay(Duration::from_micros(12_500));
    let text = m.render();
    for line in [
        "# TYPE voxgate_sessions_refused_total counter",
        "voxgate_sessions_refused_total{door=\"xiaozhi\",reason=\"capacity_door\"} 2",
        "voxgate_sessions_refused_total{door=\"mcp\",reason=\"handshake_rate\"} 1",
        "voxgate_sessions_refused_total{door=\"realtime\",reason=\"overload\"} 0",
        "voxgate_sessions_refused_total{door=\"gemini\",reason=\"per_ip\"} 0",
        "voxgate_sessions_refused_total{door=\"retell\",reason=\"capacity_server\"} 0",
        "# TYPE voxgate_scheduling_delay_seconds gauge",
        "voxgate_scheduling_delay_seconds 0.0125",
    ] {
        has_line(&text, line);
    }
    let series = text
        .lines()
        .filter(|l| l.starts_with("voxgate_sessions_refused_total{"))
        .count();
    assert_eq!(series, Door::ALL.len() * RefusalReason::ALL.len());
}

#[test]
fn server_added_keeps_its_fine_buckets() {
    let m = Metrics::new();
    m.server_added(Door::Xiaozhi, Duration::from_micros(400));
    m.server_added(Door::Xiaozhi, Duration::from_micros(500));
    m.server_added(Door::Xiaozhi, Duration::from_secs(2));
    assert_eq!(
        m.server_added_observed(Door::Xiaozhi),
        HistogramSnapshot {
            count: 3,
            sum: Duration::from_micros(2_000_900),
        }
    );
    let text = m.render();
    let name = "voxgate_turn_server_added_seconds";
    for line in [
        format!("# TYPE {name} histogram"),
        format!("{name}_bucket{{door=\"xiaozhi\",le=\"0.00025\"}} 0"),
        // An observation on a bound is inside it (`le`).
        format!("{name}_bucket{{door=\"xiaozhi\",le=\"0.0005\"}} 2"),
        format!("{name}_bucket{{door=\"xiaozhi\",le=\"1\"}} 2"),
        format!("{name}_bucket{{door=\"xiaozhi\",le=\"+Inf\"}} 3"),
        format!("{name}_count{{door=\"xiaozhi\"}} 3"),
        format!("{name}_sum{{door=\"xiaozhi\"}} 2.0009"),
        format!("{name}_count{{door=\"vip\"}} 0"),
    ] {
        has_line(&text, &line);
    }
    let buckets = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{door=\"xiaozhi\"")))
        .count();
    assert_eq!(buckets, SERVER_ADDED_BUCKETS_MICROS.len() + 1);
}

#[test]
fn stages_tools_and_interruptions_render() {
    let m = Metrics::new();
    m.stage(Door::Xiaozhi, Stage::Endpointing, Duration::from_millis(40));
    m.stage(Door::Xiaozhi, Stage::FirstAudio, Duration::from_millis(700));
    m.stage(Door::Realtime, Stage::BargeIn, Duration::from_millis(120));
    m.tool_call(
        Door::Realtime,
        ToolCallKind::Mcp,
        ToolOutcomeLabel::Timeout,
        Duration::from_secs(45),
    );
    m.tool_call(
        Door::Realtime,
        ToolCallKind::Mcp,
        ToolOutcomeLabel::Ok,
        Duration::from_millis(5),
    );
    m.interruption(Door::Retell);
    m.interruption(Door::Retell);
    m.false_interruption(Door::Retell);
    m.reply_cut(Door::Retell);
    assert_eq!(
        m.stage_observed(Door::Xiaozhi, Stage::FirstAudio),
        HistogramSnapshot {
            count: 1,
            sum: Duration::from_millis(700),
        }
    );
    assert_eq!(m.stage_observed(Door::Realtime, Stage::FirstAudio).count, 0);
    assert_eq!(
        m.tool_call_observed(Door::Realtime, ToolCallKind::Mcp)
            .count,
        2
    );
    assert_eq!(
        m.tool_calls(Door::Realtime, ToolCallKind::Mcp, ToolOutcomeLabel::Timeout),
        1
    );
    assert_eq!(
        m.tool_calls(Door::Realtime, ToolCallKind::Client, ToolOutcomeLabel::Ok),
        0
    );
    assert_eq!(m.interruptions(Door::Retell), 2);
    assert_eq!(m.false_interruptions(Door::Retell), 1);
    assert_eq!(m.replies_cut(Door::Retell), 1);
    let text = m.render();
    for line in [
        "# TYPE voxgate_turn_endpointing_seconds histogram",
        "voxgate_turn_endpointing_seconds_bucket{door=\"xiaozhi\",le=\"0.025\"} 0",
        "voxgate_turn_endpointing_seconds_bucket{door=\"xiaozhi\",le=\"0.05\"} 1",
        "voxgate_turn_first_audio_seconds_bucket{door=\"xiaozhi\",le=\"0.5\"} 0",
        "voxgate_turn_first_audio_seconds_bucket{door=\"xiaozhi\",le=\"0.75\"} 1",
        "voxgate_turn_first_audio_seconds_sum{door=\"xiaozhi\"} 0.7",
        "voxgate_barge_in_seconds_count{door=\"realtime\"} 1",
        "voxgate_barge_in_seconds_count{door=\"bridge\"} 0",
        "voxgate_tool_call_seconds_bucket{door=\"realtime\",kind=\"mcp\",le=\"0.005\"} 1",
        "voxgate_tool_call_seconds_bucket{door=\"realtime\",kind=\"mcp\",le=\"30\"} 1",
        "voxgate_tool_call_seconds_bucket{door=\"realtime\",kind=\"mcp\",le=\"+Inf\"} 2",
        "voxgate_tool_call_seconds_count{door=\"realtime\",kind=\"device\"} 0",
        "voxgate_tool_calls_total{door=\"realtime\",kind=\"mcp\",outcome=\"timeout\"} 1",
        "voxgate_tool_calls_total{door=\"realtime\",kind=\"mcp\",outcome=\"ok\"} 1",
        "voxgate_tool_calls_total{door=\"xiaozhi\",kind=\"action\",outcome=\"cancelled\"} 0",
        "voxgate_interruptions_total{door=\"retell\"} 2",
        "voxgate_false_interruptions_total{door=\"retell\"} 1",
        "voxgate_replies_cut_total{door=\"retell\"} 1",
        "voxgate_replies_cut_total{door=\"gemini\"} 0",
    ] {
        has_line(&text, line);
    }
    let buckets = text
        .lines()
        .filter(|l| l.starts_with("voxgate_barge_in_seconds_bucket{door=\"realtime\""))
        .count();
    assert_eq!(buckets, LATENCY_BUCKETS_MICROS.len() + 1);
}

/// Touches every metric once, with values that are easy to find again.
fn every_metric_touched() -> Metrics {
    let m = Metrics::new();
    m.turn(Door::Gemini);
    m.error(Door::Mcp);
    m.dropped(Door::Xiaozhi, Direction::Uplink, 7);
    m.refused(Door::Retell, RefusalReason::PerIp);
    m.set_scheduling_delay(Duration::from_millis(3));
    m.latency(
        Door::Realtime,
        ProviderKind::Llm,
        Duration::from_millis(150),
    );
    m.provider_failure(ProviderKind::Asr);
    m.provider_timeout(ProviderKind::Tts);
    m.provider_fallback(ProviderKind::Llm);
    m.webrtc_late_frames(4);
    m.webrtc_dropped_datagram();
    m.server_added(Door::Xiaozhi, Duration::from_millis(2));
    let mut s = voxgate_engine::SpeculationStats::default();
    s.adopted = 1;
    s.requests_adopted = 1;
    m.speculation(Door::Realtime, &s);
    for (i, stage) in Stage::ALL.into_iter().enumerate() {
        m.stage(
            Door::Bridge,
            stage,
            Duration::from_millis(100 * (i as u64 + 1)),
        );
    }
    m.tool_call(
        Door::Xiaozhi,
        ToolCallKind::Device,
        ToolOutcomeLabel::Error,
        Duration::from_millis(80),
    );
    m.interruption(Door::Vip);
    m.false_interruption(Door::Vip);
    m.reply_cut(Door::Vip);
    m
}

/// Every family the registry renders, with its type.
const FAMILIES: [(&str, &str); 26] = [
    ("voxgate_sessions_total", "counter"),
    ("voxgate_sessions_active", "gauge"),
    ("voxgate_turns_total", "counter"),
    ("voxgate_errors_total", "counter"),
    ("voxgate_dropped_frames_total", "counter"),
    ("voxgate_speculations_total", "counter"),
    ("voxgate_speculative_requests_total", "counter"),
    ("voxgate_sessions_refused_total", "counter"),
    ("voxgate_scheduling_delay_seconds", "gauge"),
    ("voxgate_cluster_redis_up", "gauge"),
    ("voxgate_cluster_redis_errors_total", "counter"),
    ("voxgate_cluster_routed_requests_total", "counter"),
    ("voxgate_turn_server_added_seconds", "histogram"),
    ("voxgate_turn_endpointing_seconds", "histogram"),
    ("voxgate_turn_first_audio_seconds", "histogram"),
    ("voxgate_barge_in_seconds", "histogram"),
    ("voxgate_provider_latency_seconds", "histogram"),
    ("voxgate_provider_failures_total", "counter"),
    ("voxgate_provider_timeouts_total", "counter"),
    ("voxgate_provider_fallbacks_total", "counter"),
    ("voxgate_tool_call_seconds", "histogram"),
    ("voxgate_tool_calls_total", "counter"),
    ("voxgate_interruptions_total", "counter"),
    ("voxgate_false_interruptions_total", "counter"),
    ("voxgate_replies_cut_total", "counter"),
    ("voxgate_webrtc_late_frames_total", "counter"),
];

/// The value of the sample `metric` whose labels are exactly `labels`.
fn scalar(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let want: HashMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && *s.labels == want)
        .unwrap_or_else(|| panic!("{metric}{labels:?} not parsed"));
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        ref other => panic!("{metric} is {other:?}"),
    }
}

/// The `(le, cumulative count)` buckets of one histogram series.
fn buckets(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let want: HashMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && *s.labels == want)
        .unwrap_or_else(|| panic!("{metric}{labels:?} not parsed"));
    let Value::Histogram(h) = &sample.value else {
        panic!("{metric} is not a histogram: {:?}", sample.value);
    };
    h.iter().map(|b| (b.less_than, b.count)).collect()
}

/// The exposition with every metric touched is read by a third-party parser
/// (`prometheus-parse`), line by line and whole, and its values come back.
#[test]
fn a_third_party_parser_reads_the_exposition() {
    let m = every_metric_touched();
    let _vip = m.session(Door::Vip);
    let text = m.render();
    // Line by line: every line is a HELP, a TYPE or a sample; `prometheus-parse` drops lines
    // it cannot read, so a silent drop must fail here.
    let mut helps = HashSet::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        match LineInfo::parse(line) {
            LineInfo::Doc { metric_name, doc } => {
                assert!(doc.len() > 20, "{metric_name} has a thin HELP: {doc}");
                assert!(helps.insert(metric_name.to_owned()), "{metric_name} twice");
            }
            LineInfo::Type {
                metric_name,
                metric_alias,
                sample_type,
            } => {
                let name = metric_alias.unwrap_or(metric_name);
                types.insert(name, format!("{sample_type:?}").to_lowercase());
            }
            LineInfo::Sample { metric_name, .. } => {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| {
                        metric_name
                            .strip_suffix(s)
                            .filter(|base| types.get(*base).is_some_and(|t| t == "histogram"))
                    })
                    .unwrap_or(metric_name);
                assert!(types.contains_key(family), "{metric_name} before its TYPE");
                assert!(helps.contains(family), "{metric_name} without HELP");
            }
            other => panic!("unreadable line {line:?}: {other:?}"),
        }
    }
    let mut families = FAMILIES.to_vec();
    families.push(("voxgate_webrtc_dropped_datagrams_total", "counter"));
    families.push(("voxgate_webrtc_candidates_ignored_total", "counter"));
    for (name, kind) in &families {
        assert_eq!(types.get(*name).map(String::as_str), Some(*kind), "{name}");
    }
    assert_eq!(types.len(), families.len(), "{types:?}");

    // Whole: the parsed values are the ones recorded.
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let door = |d: &'static str| vec![("door", d)];
    assert_eq!(scalar(&scrape, "voxgate_sessions_total", &door("vip")), 1.0);
    assert_eq!(
        scalar(&scrape, "voxgate_sessions_active", &door("vip")),
        1.0
    );
    assert_eq!(
        scalar(&scrape, "voxgate_sessions_active", &door("xiaozhi")),
        0.0
    );
    assert_eq!(scalar(&scrape, "voxgate_turns_total", &door("gemini")), 1.0);
    assert_eq!(scalar(&scrape, "voxgate_errors_total", &door("mcp")), 1.0);
    assert_eq!(
        scalar(
            &scrape,
            "voxgate_dropped_frames_total",
            &[("door", "xiaozhi"), ("direction", "uplink")]
        ),
        7.0
    );
    assert_eq!(
        scalar(
            &scrape,
            "voxgate_sessions_refused_total",
            &[("door", "retell"), ("reason", "per_ip")]
        ),
        1.0
    );
    assert_eq!(
        scalar(&scrape, "voxgate_scheduling_delay_seconds", &[]),
        0.003
    );
    assert_eq!(
        scalar(
            &scrape,
            "voxgate_speculations_total",
            &[("door", "realtime"), ("outcome", "adopted")]
        ),
        1.0
    );
    assert_eq!(
        scalar(
            &scrape,
            "voxgate_provider_failures_total",
            &[("provider", "asr")]
        ),
        1.0
    );
    assert_eq!(
        scalar(&scrape, "voxgate_webrtc_late_frames_total", &[]),
        4.0
    );
    assert_eq!(
        scalar(&scrape, "voxgate_webrtc_dropped_datagrams_total", &[]),
        1.0
    );
    assert_eq!(
        scalar(
            &scrape,
            "voxgate_tool_calls_total",
            &[
                ("door", "xiaozhi"),
                ("kind", "device"),
                ("outcome", "error")
            ]
        ),
        1.0
    );
    for name in [
        "voxgate_interruptions_total",
        "voxgate_false_interruptions_total",
        "voxgate_replies_cut_total",
    ] {
        assert_eq!(scalar(&scrape, name, &door("vip")), 1.0, "{name}");
        assert_eq!(scalar(&scrape, name, &door("realtime")), 0.0, "{name}");
    }

    let llm = [("door", "realtime"), ("provider", "llm")];
    let b = buckets(&scrape, "voxgate_provider_latency_seconds", &llm);
    assert_eq!(b.len(), LATENCY_BUCKETS_MICROS.len() + 1);
    assert_eq!(b.last(), Some(&(f64::INFINITY, 1.0)));
    assert!(b.contains(&(0.1, 0.0)) && b.contains(&(0.2, 1.0)), "{b:?}");
    assert_eq!(
        scalar(&scrape, "voxgate_provider_latency_seconds_sum", &llm),
        0.15
    );
    assert_eq!(
        scalar(&scrape, "voxgate_provider_latency_seconds_count", &llm),
        1.0
    );
    for (i, stage) in Stage::ALL.into_iter().enumerate() {
        let name = stage.metric_name();
        let b = buckets(&scrape, name, &door("bridge"));
        assert_eq!(b.last(), Some(&(f64::INFINITY, 1.0)), "{name}");
        let sum = scalar(&scrape, &format!("{name}_sum"), &door("bridge"));
        assert!((sum - 0.1 * (i as f64 + 1.0)).abs() < 1e-9, "{name} {sum}");
        let b = buckets(&scrape, name, &door("gemini"));
        assert!(b.iter().all(|&(_, n)| n == 0.0), "{name} {b:?}");
    }
    let b = buckets(
        &scrape,
        "voxgate_turn_server_added_seconds",
        &door("xiaozhi"),
    );
    assert_eq!(b.len(), SERVER_ADDED_BUCKETS_MICROS.len() + 1);
    assert!(
        b.contains(&(0.001, 0.0)) && b.contains(&(0.002, 1.0)),
        "{b:?}"
    );
    let b = buckets(
        &scrape,
        "voxgate_tool_call_seconds",
        &[("door", "xiaozhi"), ("kind", "device")],
    );
    assert!(b.contains(&(0.05, 0.0)) && b.contains(&(0.1, 1.0)), "{b:?}");
}

/// Several registries live side by side (one per server in a test process).
#[test]
fn registries_are_independent() {
    let a = Metrics::new();
    let b = Metrics::default();
    a.turn(Door::Realtime);
    assert_eq!(a.turns(Door::Realtime), 1);
    assert_eq!(b.turns(Door::Realtime), 0);
    has_line(&b.render(), "voxgate_turns_total{door=\"realtime\"} 0");
}
