//! Argument validation against a typical tool schema (compiled once per tool).

// A benchmark that unwraps fails loudly on a broken setup, like a test.
#![allow(clippy::unwrap_used)]

use divan::{AllocProfiler, Bencher, black_box};
use serde_json::{Value, json};
use voxgate_mcp::model::Tool;
use voxgate_mcp::registry::{ToolRegistry, ToolSource};
use voxgate_mcp::schema::CompiledSchema;

#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

fn main() {
    divan::main();
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "volume": {"type": "integer", "minimum": 0, "maximum": 100},
            "mode": {"type": "string", "enum": ["normal", "night", "boost"]},
            "fade_ms": {"type": "integer", "minimum": 0}
        },
        "required": ["volume"],
        "additionalProperties": false
    })
}

#[divan::bench]
fn valid_arguments(bencher: Bencher<'_, '_>) {
    let s = CompiledSchema::compile(&schema()).unwrap();
    let args = json!({"volume": 42, "mode": "night", "fade_ms": 300});
    bencher.bench_local(|| s.validate(black_box(&args)).is_ok());
}

#[divan::bench]
fn invalid_arguments_with_report(bencher: Bencher<'_, '_>) {
    let s = CompiledSchema::compile(&schema()).unwrap();
    let args = json!({"volume": 420, "mode": "loud"});
    bencher.bench_local(|| s.validate(black_box(&args)).unwrap_err());
}

#[divan::bench]
fn registry_prepare_call(bencher: Bencher<'_, '_>) {
    let mut r = ToolRegistry::new();
    r.set_source_tools(
        ToolSource::Device,
        vec![Tool::new("self.audio_speaker.set_volume", "", schema())],
    );
    bencher
        .with_inputs(|| json!({"volume": 42, "mode": "night"}))
        .bench_local_values(|args| {
            r.prepare_call("self_audio_speaker_set_volume", args)
                .unwrap()
        });
}
