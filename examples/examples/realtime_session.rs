//! A realtime session without sockets: the client's frames go through a tiny server loop and
//! back, showing the handshake, a text turn and a protocol error.
//!
//! `cargo run -p voxgate-examples --example realtime_session`

use bytes::Bytes;
use voxgate_realtime::proto::InferenceTriggerMode;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::service_bound_message::Payload as Up;
use voxgate_realtime::{
    AudioFormat, ClientBoundMessage, Error, ProtocolError, ServiceBoundMessage, SessionConfig,
};

/// The server half: what a door does with one received binary frame.
struct Server {
    session: Option<SessionConfig>,
    next_turn: u32,
}

impl Server {
    fn on_frame(&mut self, frame: Bytes) -> Vec<ClientBoundMessage> {
        let message = match ServiceBoundMessage::decode_frame(frame) {
            Ok(message) => message,
            // Malformed bytes: tell the client why, in the protocol's own terms.
            Err(e) => return vec![e.to_client_message()],
        };
        match (&self.session, message.payload) {
            (None, Some(Up::InitializeSessionRequest(request))) => {
                match SessionConfig::from_wire(&request) {
                    Ok(config) => {
                        self.session = Some(config);
                        vec![ClientBoundMessage::session_ready()]
                    }
                    Err(e) => vec![Error::from(e).to_client_message()],
                }
            }
            (Some(_), Some(Up::UserInput(input))) => {
                let text = match input.input {
                    Some(voxgate_realtime::proto::user_input::Input::TextData(t)) => t.data,
                    _ => String::from("(audio)"),
                };
                self.next_turn += 1;
                let turn = self.next_turn;
                vec![
                    ClientBoundMessage::response_begin(turn),
                    ClientBoundMessage::model_text_fragment(
                        format!("You said: {text}"),
                        Some(turn),
                    ),
                    ClientBoundMessage::response_end(turn),
                ]
            }
            (Some(_), Some(Up::Ping(_))) => vec![ClientBoundMessage::pong()],
            (None, _) => vec![
                Error::from(ProtocolError::NotInitialized { message: "input" }).to_client_message(),
            ],
            (Some(_), _) => Vec::new(),
        }
    }
}

fn describe(message: &ClientBoundMessage) -> String {
    match &message.payload {
        Some(Down::SessionReady(_)) => "SessionReady".into(),
        Some(Down::ResponseBegin(b)) => format!("ResponseBegin(turn {})", b.turn_id),
        Some(Down::ModelTextFragment(f)) => format!("ModelTextFragment({:?})", f.text),
        Some(Down::ResponseEnd(e)) => format!("ResponseEnd(turn {})", e.turn_id),
        Some(Down::Pong(_)) => "Pong".into(),
        Some(Down::Error(e)) => format!(
            "SessionErrorNotification({:?}: {})",
            e.category(),
            e.message
        ),
        other => format!("{other:?}"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut server = Server {
        session: None,
        next_turn: 0,
    };
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);

    let frames = [
        // Text before initialization is an ERROR_SESSION problem.
        ServiceBoundMessage::user_text(1, InferenceTriggerMode::Immediate, "too early").to_frame(),
        ServiceBoundMessage::initialize(&config)?.to_frame(),
        ServiceBoundMessage::user_text(2, InferenceTriggerMode::Immediate, "hello").to_frame(),
        ServiceBoundMessage::ping().to_frame(),
        // Garbage is an ERROR_PROTOCOL problem, never a panic.
        Bytes::from_static(&[0xff, 0xff, 0xff]),
    ];
    for frame in frames {
        println!("client -> server: {} bytes", frame.len());
        for reply in server.on_frame(frame) {
            // Round-trip through the wire format, as the client would receive it.
            let received = ClientBoundMessage::decode_frame(reply.to_frame())?;
            println!("  server -> client: {}", describe(&received));
        }
    }
    Ok(())
}
