//! The Xiaozhi ESP32 device protocol, as typed data.
//!
//! A Xiaozhi device fetches its server's address from an OTA endpoint, opens a WebSocket, sends a
//! JSON `hello`, and then streams Opus audio in binary frames while both sides exchange JSON
//! control messages. This crate is the codec for all of it and nothing more: it never touches a
//! socket, a thread, an async runtime or the clock (time comes in as a value), and it never
//! panics on peer input.
//!
//! | module        | what it covers                                                         |
//! |---------------|------------------------------------------------------------------------|
//! | [`frame`]     | binary framing v1/v2/v3, fixed per connection, allocation-free         |
//! | [`control`]   | every JSON control message in both directions, tolerant parsing        |
//! | [`emotion`]   | the firmware's 21 face names and their emoji, for `llm` and `alert`   |
//! | [`ota`]       | the OTA request (lenient) and response                                 |
//! | [`token`]     | HMAC-SHA256 device tokens                                              |
//! | [`connect`]   | WebSocket upgrade parameters and authentication                        |
//!
//! Errors say who is to blame. Decoding errors ([`frame::DecodeError`],
//! [`control::ParseError`], [`token::TokenError`], [`connect::AuthError`]) are the peer's;
//! [`frame::EncodeError`] is the caller's. Unknown message types and enum values are data
//! ([`control::UnknownMessage`], `Other(String)` variants, [`frame::FrameType`]), so a newer
//! peer does not break an older server.
//!
//! # Binary frames
//!
//! ```
//! use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};
//!
//! // The `Protocol-Version` header fixes the framing for the whole connection.
//! let codec = FrameCodec::new(ProtocolVersion::from_header("3")?);
//! let opus = [0x58, 0x00, 0x01, 0x02];
//!
//! let mut out = Vec::with_capacity(codec.max_frame_len()); // reuse it for every frame
//! codec.encode(&Frame::opus(&opus), &mut out)?;
//! assert_eq!(out, [0x00, 0x00, 0x00, 0x04, 0x58, 0x00, 0x01, 0x02]);
//!
//! let frame = codec.decode(&out)?; // borrows the payload: no copy, no allocation
//! assert_eq!(frame.payload, opus);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Control messages
//!
//! ```
//! use voxgate_xiaozhi::control::{DeviceMessage, ServerHello, ServerMessage, Tts};
//!
//! // Real clients send sloppy JSON: spacing, escaped Unicode, no session id, no transport.
//! let hello = DeviceMessage::from_slice(br#"{"type": "hello", "version": 1,
//!     "features": {"mcp": true}, "audio_params": {"format": "opus", "sample_rate": 16000,
//!     "channels": 1, "frame_duration": 20}}"#)?;
//! let DeviceMessage::Hello(hello) = hello else { unreachable!() };
//! assert_eq!(hello.features.mcp, Some(true));
//! assert_eq!(hello.uplink_audio().frame_duration, 20);
//!
//! // The answer always carries everything the firmware and third-party clients need.
//! let answer = ServerMessage::from(ServerHello::new("session-1")).to_json();
//! assert!(answer.contains(r#""transport":"websocket""#));
//!
//! // Unknown types are kept, not rejected.
//! let unknown = DeviceMessage::from_slice(br#"{"type":"goodbye","session_id":"s"}"#)?;
//! assert_eq!(unknown.message_type(), "goodbye");
//! assert_eq!(ServerMessage::from(Tts::stop()).to_json(), r#"{"type":"tts","state":"stop"}"#);
//! # Ok::<(), voxgate_xiaozhi::control::ParseError>(())
//! ```
//!
//! # Emotion
//!
//! The `llm` frame names one of the firmware's faces; the emoji goes along as `text`. Choosing
//! the face from a model's reply is the engine's job (`voxgate_engine::emotion`), not the
//! protocol's.
//!
//! ```
//! use voxgate_xiaozhi::control::{Llm, ServerMessage};
//! use voxgate_xiaozhi::emotion::Emotion;
//!
//! let llm = Llm { session_id: None, text: "😂".to_owned(), emotion: Emotion::Funny };
//! assert_eq!(
//!     ServerMessage::from(llm).to_json(),
//!     r#"{"type":"llm","text":"😂","emotion":"funny"}"#
//! );
//! assert_eq!(Emotion::Funny.emoji(), Some("😂"));
//! ```
//!
//! # MCP envelope
//!
//! The JSON-RPC payload is kept as raw JSON text: the envelope parse builds no tree for it, the
//! JSON-RPC layer decodes the text straight into its own types, and it is written back verbatim.
//!
//! ```
//! use serde_json::json;
//! use voxgate_xiaozhi::control::{DeviceMessage, Mcp};
//!
//! let from_device = br#"{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"result":{"isError":false}}}"#;
//! let DeviceMessage::Mcp(envelope) = DeviceMessage::from_slice(from_device)? else { unreachable!() };
//! assert_eq!(envelope.payload_json(), r#"{"jsonrpc":"2.0","id":3,"result":{"isError":false}}"#);
//! assert_eq!(envelope.payload_value()?["id"], 3); // only when a `Value` is really wanted
//!
//! let to_device = Mcp::wrap(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}));
//! assert!(to_device.session_id.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # OTA, tokens and the upgrade request
//!
//! ```
//! use voxgate_xiaozhi::connect::ConnectParams;
//! use voxgate_xiaozhi::frame::ProtocolVersion;
//! use voxgate_xiaozhi::ota::{OtaResponse, WebSocketConfig};
//! use voxgate_xiaozhi::token::{self, TokenSecret};
//!
//! let secret = TokenSecret::new("server secret")?;
//! let now = 1_700_000_000; // the caller's clock, in Unix seconds
//! let issued = token::issue(&secret, "client-uuid", "aa:bb:cc:dd:ee:ff", now)?;
//! let ota = OtaResponse {
//!     websocket: Some(
//!         WebSocketConfig::new("ws://192.168.1.2:8000/xiaozhi/v1/", ProtocolVersion::V2)
//!             .with_token(issued.clone()),
//!     ),
//!     ..OtaResponse::default()
//! };
//! assert!(!ota.to_json().contains("mqtt"));
//!
//! let bearer = format!("Bearer {issued}");
//! let upgrade = ConnectParams::from_headers([
//!     ("authorization", bearer.as_str()),
//!     ("protocol-version", "2"),
//!     ("device-id", "aa:bb:cc:dd:ee:ff"),
//!     ("client-id", "client-uuid"),
//! ]);
//! assert_eq!(upgrade.framing()?, ProtocolVersion::V2);
//! assert_eq!(token::verify(&secret, upgrade.token.as_deref().unwrap_or(""), "client-uuid", "aa:bb:cc:dd:ee:ff", now + 5), Ok(now));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod connect;
pub mod control;
pub mod emotion;
pub mod frame;
mod lenient;
mod macros;
pub mod ota;
pub mod token;

/// The `bytes` crate, re-exported because [`frame::SharedFrame`] and [`FrameCodec::encode`]
/// speak its types.
pub use bytes;
pub use control::{DeviceMessage, ParseError, ServerMessage};
pub use frame::{Frame, FrameCodec, ProtocolVersion};
