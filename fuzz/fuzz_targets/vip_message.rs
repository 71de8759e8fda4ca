//! VIP data-channel messages from either side: decoding never panics; whatever decodes
//! re-encodes to text that decodes again, as the same type (a client message may then only be
//! refused for growing past a size bound: `1e9` re-encodes as `1000000000.0`); and the state
//! machine, driven by the input's bytes, keeps its invariants.
//!
//! Input: the whole input is one message (decoded as bytes and as text, both directions); the
//! same bytes, read as a sequence of machine inputs (the low 4 bits pick the input, the high
//! 4 bits the turn), drive a `VipMachine`.
#![no_main]

use voxgate_vip::{ClientMessage, DecodeError, ServerMessage, VipInput, VipMachine, VipState};

fn size_refusal(e: &DecodeError) -> bool {
    match e {
        DecodeError::TooLarge { .. } => true,
        DecodeError::Invalid { path, message, .. } => {
            (path == "/data" || path == "/error") && message.contains("more than the maximum")
        }
        _ => false,
    }
}

fn machine_input(byte: u8) -> VipInput {
    let turn = u64::from(byte >> 4);
    match byte & 0x0f {
        0 | 9 => VipInput::SpeechStarted,
        1 => VipInput::SpeechDiscarded,
        2 | 10 => VipInput::EndOfSpeech { turn },
        3 => VipInput::TextInput { turn },
        4 | 11 => VipInput::ReplyStarted { turn },
        5 | 12 => VipInput::ActionInvoked { turn },
        6 | 13 => VipInput::ActionSettled { turn },
        7 | 14 => VipInput::PlaybackFinished { turn },
        _ => VipInput::TurnEnded { turn },
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = ClientMessage::decode_slice(data) {
        let text = msg.encode();
        match ClientMessage::decode(&text) {
            Ok(again) => assert_eq!(again.type_name(), msg.type_name(), "{text}"),
            Err(e) => assert!(
                size_refusal(&e),
                "re-encoded client message refused: {e}: {text}"
            ),
        }
    }
    if let Ok(msg) = ServerMessage::decode_slice(data) {
        let text = msg.encode();
        let again = ServerMessage::decode(&text);
        assert!(
            again.is_ok(),
            "re-encoded server message must decode: {text}"
        );
        if let Ok(again) = again {
            assert_eq!(again.type_name(), msg.type_name(), "{text}");
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        // The text entry point agrees with the bytes one.
        assert_eq!(
            ClientMessage::decode(text).is_ok(),
            ClientMessage::decode_slice(data).is_ok()
        );
    }

    let mut machine = VipMachine::new();
    for &byte in data.iter().take(4096) {
        let before = (machine.state(), machine.turn());
        if let Some(change) = machine.handle_input(machine_input(byte)) {
            assert_eq!(change.from, before.0);
            assert_eq!(change.to, machine.state());
            assert_eq!(change.turn, machine.turn());
            assert!(
                change.from != change.to || change.turn != before.1,
                "{change:?}"
            );
        } else {
            assert_eq!((machine.state(), machine.turn()), before);
        }
        let state = machine.state();
        assert_eq!(
            machine.turn().is_none(),
            matches!(state, VipState::Idle | VipState::Listening),
            "{state:?} {:?}",
            machine.turn()
        );
        assert_eq!(machine.pending_actions() > 0, state == VipState::Action);
    }
});
