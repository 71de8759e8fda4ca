//! `voxgate-client`: speak any voxgate door's protocol from the command line.
//!
//! Each door has a module whose `run` function plays one session: it takes its options and an
//! [`Events`](events::Events) sink that receives every server event as a JSON object (printed
//! one per line by the binary, recorded in memory by tests), and returns what happened.
//!
//! | module | door | protocol |
//! |---|---|---|
//! | [`realtime`] | `/realtime` | protobuf session protocol (voxgate-realtime) |
//! | [`xiaozhi`] | `/xiaozhi/v1/` | ESP32 device: hello, Opus audio, MCP (voxgate-xiaozhi) |
//! | [`retell`] | `/llm-websocket/{call_id}` | Retell's side of the custom-LLM socket (voxgate-retell) |
//! | [`gemini`] | `/gemini`, port 3001 | the Gemini bridge JSON protocol (voxgate-gemini) |
//! | [`webrtc`] | `POST /webrtc/offer` (VIP), `/gemini` `WEBRTC_OFFER` | a str0m WebRTC peer: Opus on the audio track, VIP events on the `vip` data channel |
//! | [`load`] | `/xiaozhi/v1/` | N concurrent streaming devices, counting frames |
//! | [`webrtc::load`] | `POST /webrtc/offer` | N concurrent WebRTC sessions: latency, lost and late packets, server CPU and memory |
//! | [`chaos`] | `/xiaozhi/v1/`, `/realtime`, `/gemini`, `/llm-websocket/{call_id}`, the Bridge API | floods, slowloris and misbehaving peers against admission control and timeouts; attacks on what one peer can make the server spend |
//!
//! [`cli`] holds the command-line grammar and turns arguments into options.

pub mod audio;
pub mod chaos;
pub mod cli;
pub mod events;
pub mod gemini;
pub mod load;
pub mod load_realtime;
mod procstat;
pub mod realtime;
pub mod retell;
pub mod webrtc;
pub mod ws;
pub mod xiaozhi;
