//! Whole conversations on a virtual clock with scripted providers.

mod common;

use common::*;
use serde_json::json;
use voxgate_engine::emotion::{EmojiPolicy, Emotion};
use voxgate_engine::history::{Content, DeliveryStatus, Role};
use voxgate_engine::provider::{ChatRole, ProviderEvent};
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, InputError, Output, ProviderRequest, State, ToolDefinition,
    TriggerMode,
};

fn text_only() -> EngineConfig {
    EngineConfig {
        output_audio: None,
        system_prompt: "You are terse.".into(),
        ..EngineConfig::default()
    }
}

fn text(t: &str) -> Input {
    Input::Text {
        text: t.into(),
        mode: TriggerMode::Queue,
    }
}

#[test]
fn text_turn_without_tts_streams_fragments() {
    let mut d = Driver::new(text_only());
    let out = d.input(text("What is 2+2?"));
    let (id, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].role, ChatRole::System);
    assert_eq!(messages[1].content, "What is 2+2?");

    let mut events = client(&d.provider(delta(id, "It is ")));
    events.extend(client(&d.provider(delta(id, "4."))));
    events.extend(client(&d.provider(done(id))));
    let turn = d.engine.history()[1].turn.unwrap();
    assert_eq!(
        events,
        [
            ClientEvent::ResponseBegin { turn },
            ClientEvent::TextFragment {
                turn,
                text: "It is ".into()
            },
            ClientEvent::TextFragment {
                turn,
                text: "4.".into()
            },
            ClientEvent::ResponseEnd { turn },
            ClientEvent::ResponseFinished {
                turn,
                interrupted: false
            },
        ]
    );
    let h = d.engine.history();
    assert_eq!(
        (h[0].role, h[0].text().as_str()),
        (Role::User, "What is 2+2?")
    );
    assert_eq!(
        (h[1].role, h[1].text().as_str()),
        (Role::Assistant, "It is 4.")
    );
    assert_eq!(h[1].delivery, DeliveryStatus::Complete);
    assert_eq!(d.engine.state(), State::Idle);
}

#[test]
fn spoken_reply_follows_the_xiaozhi_order() {
    let mut d = Driver::new(EngineConfig {
        emotion: Some(EmojiPolicy::faces()),
        ..EngineConfig::default()
    });
    let (id, _) = generate(&d.input(text("hello")));
    let mut out = d.provider(delta(id, "😆 Hi the"));
    out.extend(d.provider(delta(id, "re! The answer is 3.5 ")));
    out.extend(d.provider(delta(id, "litres. Bye")));
    out.extend(d.provider(done(id)));
    let sentences = synth(&out);
    let texts: Vec<&str> = sentences.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["Hi there!", "The answer is 3.5 litres.", "Bye"]);
    // The second sentence's audio arrives first: it is held until the first is done.
    let (s1, s2, s3) = (sentences[0].0, sentences[1].0, sentences[2].0);
    let mut events = client(&d.provider(tts_audio(s2, 400)));
    events.extend(client(&d.provider(done(s2))));
    assert!(events.is_empty(), "{events:?}");
    for e in [
        tts_audio(s1, 200),
        tts_audio(s1, 200),
        done(s1),
        tts_audio(s3, 100),
        done(s3),
    ] {
        d.provider(e);
    }
    d.advance(2000 * MS);
    let turn = d.engine.history()[1].turn.unwrap();
    let shape: Vec<String> = d
        .client_events()
        .iter()
        .map(|e| match e {
            ClientEvent::ResponseBegin { .. } => "begin".into(),
            ClientEvent::Emotion { emotion, .. } => format!("emotion {}", emotion.as_str()),
            ClientEvent::SentenceStart { text, .. } => format!("sentence {text}"),
            ClientEvent::AudioChunk { samples, .. } => format!("audio {}", samples.len()),
            ClientEvent::ResponseEnd { .. } => "end".into(),
            ClientEvent::ResponseFinished { .. } => "finished".into(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        shape,
        [
            "begin",
            "emotion laughing",
            "sentence Hi there!",
            "audio 4800",
            "audio 4800",
            "sentence The answer is 3.5 litres.",
            "audio 9600",
            "sentence Bye",
            "audio 2400",
            "end",
            "finished"
        ]
    );
    assert!(matches!(
        d.client_events()[1],
        ClientEvent::Emotion {
            emotion: Emotion::Laughing,
            ..
        }
    ));
    let h = d.engine.history();
    assert_eq!(h[1].text(), "Hi there! The answer is 3.5 litres. Bye");
    assert_eq!(h[1].turn, Some(turn));
}

const PARTS: [&str; 3] = ["turn the lights on", "in the kitchen", "please"];

#[test]
fn audio_turn_through_vad_transcribes_the_utterance_with_its_backbuffer() {
    let mut d = Driver::new(text_only());
    let speech = speech();
    let mut out = d.speak(&speech);
    out.extend(d.silence(600));
    let vad: Vec<_> = client(&out)
        .into_iter()
        .filter(|e| matches!(e, ClientEvent::VadState { .. }))
        .collect();
    assert!(vad.len() >= 4, "{vad:?}");
    let asr: Vec<_> = requests(&out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe {
                id,
                audio,
                sample_rate,
            } => Some((id, audio, sample_rate)),
            _ => None,
        })
        .collect();
    assert!(!asr.is_empty());
    let total: usize = asr.iter().map(|(_, a, _)| a.len()).sum();
    // Speech runs 12 800..69 730 in the fixture: the utterances cover it and start up to the
    // 500 ms backbuffer earlier.
    assert!(total >= 69_730 - 12_800, "{total}");
    assert!(asr.iter().all(|(_, _, rate)| *rate == 16_000));
    // The turn waits for the transcript.
    assert_eq!(d.engine.state(), State::Listening);
    let mut out = Vec::new();
    for (i, (id, _, _)) in asr.iter().enumerate() {
        out.extend(d.provider(ProviderEvent::Transcript {
            id: *id,
            text: PARTS[i % PARTS.len()].into(),
            language: "en".into(),
        }));
    }
    out.extend(d.advance(1000 * MS));
    let events = client(&out);
    let said = events
        .iter()
        .find_map(|e| match e {
            ClientEvent::UserTranscription { text, language, .. } => {
                Some((text.clone(), language.clone()))
            }
            _ => None,
        })
        .unwrap();
    let expected = (0..asr.len())
        .map(|i| PARTS[i % PARTS.len()])
        .collect::<Vec<_>>()
        .join(" ");
    let expected = expected.as_str();
    assert_eq!(said, (expected.to_owned(), "en".to_owned()));
    let (_, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    assert_eq!(messages.last().unwrap().content, expected);
    let user = &d.engine.history()[0];
    match &user.content[0] {
        Content::InputAudio(a) => {
            assert_eq!(a.samples.len(), total);
            assert_eq!(a.transcription, expected);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn barge_in_truncates_history_to_the_reported_playback() {
    let mut config = EngineConfig::default();
    config.turn.playback_reports = true;
    let mut d = Driver::new(config);
    let (id, _) = generate(&d.input(text("tell me a story")));
    let mut out = d.provider(delta(id, "Once upon a time. There lived a very old king "));
    out.extend(d.provider(delta(id, "in a castle. He was")));
    let s = synth(&out);
    assert_eq!(s.len(), 2);
    // One second of audio per sentence: 48 000 output bytes each.
    d.provider(tts_audio(s[0].0, 1000));
    d.provider(done(s[0].0));
    d.provider(tts_audio(s[1].0, 1000));
    d.provider(done(s[1].0));
    let turn = d.engine.history()[1].turn.unwrap();
    assert_eq!(d.engine.state(), State::Speaking);
    // The client has played the first sentence and 40% of the second.
    d.input(Input::PlaybackReport {
        turn,
        bytes_played: 48_000 + 19_200,
    });
    // The user starts talking over the reply.
    let out = d.speak(&speech()[..16_000 * 2]);
    let mut asr = transcribes(&out);
    let reqs = requests(&out);
    let events = client(&out);
    let clear = events
        .iter()
        .position(|e| *e == ClientEvent::ClearPlayback)
        .expect("playback cleared");
    assert!(events[clear..].contains(&ClientEvent::ResponseFinished {
        turn,
        interrupted: true
    }));
    // The LLM stream is cancelled.
    assert!(reqs.contains(&ProviderRequest::Cancel { id }));
    let reply = &d.engine.history()[1];
    assert_eq!(reply.delivery, DeliveryStatus::Interrupted);
    // 40% of "There lived a very old king in a castle." (40 chars) is 16 chars: 3 whole words.
    assert_eq!(reply.text(), "Once upon a time. There lived a");

    // Late events of the cancelled work change nothing.
    let stale_before = d.engine.stale_events();
    let mut late = d.provider(delta(id, "The end."));
    late.extend(d.provider(tts_audio(s[1].0, 500)));
    late.extend(d.provider(done(id)));
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(d.engine.stale_events(), stale_before + 3);
    assert_eq!(
        d.engine.history()[1].text(),
        "Once upon a time. There lived a"
    );

    // The interruption becomes the next user turn; the model sees what was heard.
    let mut out = d.speak(&speech()[16_000 * 2..]);
    out.extend(d.silence(600));
    asr.extend(transcribes(&out));
    let mut out = Vec::new();
    for id in asr {
        out.extend(d.provider(ProviderEvent::Transcript {
            id,
            text: "wait".into(),
            language: "en".into(),
        }));
    }
    out.extend(d.advance(500 * MS));
    let (_, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    let assistant = messages
        .iter()
        .find(|m| m.role == ChatRole::Assistant)
        .unwrap();
    assert_eq!(assistant.content, "Once upon a time. There lived a");
}

#[test]
fn barge_in_without_reports_estimates_from_time() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(text("count")));
    let out = d.provider(delta(
        id,
        "One two three four five six seven eight nine ten. Next",
    ));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 2000));
    d.provider(done(s[0].0));
    // Speech starts 0.8 s into the fixture; barge-in is declared ~0.3 s after the VAD says
    // speech, so about 1.2 s of the 2 s sentence was heard.
    d.speak(&speech()[..16_000 * 2]);
    let reply = &d.engine.history()[1];
    assert_eq!(reply.delivery, DeliveryStatus::Interrupted);
    let heard = reply.text();
    assert!(heard.starts_with("One two three four"), "{heard}");
    assert!(!heard.contains("ten"), "{heard}");
}

#[test]
fn client_tool_round_trip() {
    let mut d = Driver::new(text_only());
    d.input(Input::SetTools(vec![ToolDefinition {
        name: "weather.get".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}),
    }]));
    let (id, req) = generate(&d.input(text("Weather in Paris?")));
    let ProviderRequest::Generate { tools, .. } = req else {
        unreachable!()
    };
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "weather_get");
    let mut out = d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "call-1".into(),
        name: "weather_get".into(),
        arguments: json!("{\"city\":\"Paris\"}"),
    });
    out.extend(d.provider(done(id)));
    let events = client(&out);
    assert!(events.contains(&ClientEvent::ToolCallRequest {
        id: "call-1".into(),
        name: "weather.get".into(),
        arguments: json!({"city":"Paris"}),
        turn: d.engine.history()[1].turn.unwrap(),
    }));
    assert_eq!(d.engine.state(), State::Action);
    // A result for a call that was never made is the client's fault.
    assert_eq!(
        d.try_input(Input::ToolResult {
            id: "nope".into(),
            result: "x".into()
        }),
        Err(InputError::UnknownToolCall("nope".into()))
    );
    let out = d.input(Input::ToolResult {
        id: "call-1".into(),
        result: "sunny, 21 C".into(),
    });
    let (id2, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    let n = messages.len();
    assert_eq!(messages[n - 2].role, ChatRole::Assistant);
    assert_eq!(messages[n - 2].tool_calls[0].name, "weather_get");
    assert_eq!(messages[n - 1].role, ChatRole::Tool);
    assert_eq!(messages[n - 1].content, "sunny, 21 C");
    assert_eq!(messages[n - 1].tool_call_id.as_deref(), Some("call-1"));
    d.provider(delta(id2, "It is sunny."));
    d.provider(done(id2));
    assert_eq!(d.engine.state(), State::Idle);
    let h = d.engine.history();
    assert!(h[1].content.contains(&Content::ToolResult {
        id: "call-1".into(),
        result: "sunny, 21 C".into()
    }));
    assert_eq!(h.last().unwrap().text(), "It is sunny.");
}

#[test]
fn invalid_tool_arguments_go_back_to_the_model_not_the_client() {
    let mut d = Driver::new(text_only());
    d.input(Input::SetTools(vec![ToolDefinition {
        name: "weather.get".into(),
        description: String::new(),
        parameters: json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}),
    }]));
    let (id, _) = generate(&d.input(text("Weather?")));
    let mut out = d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "c".into(),
        name: "weather_get".into(),
        arguments: json!({"town": 3}),
    });
    out.extend(d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "d".into(),
        name: "launch_rockets".into(),
        arguments: json!({}),
    }));
    out.extend(d.provider(done(id)));
    assert!(
        !client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::ToolCallRequest { .. }))
    );
    let (_, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    let results: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results[0].contains("invalid_arguments"), "{}", results[0]);
    assert!(results[1].contains("unknown_tool"), "{}", results[1]);
}

fn transcribes(out: &[Output]) -> Vec<voxgate_engine::RequestId> {
    requests(out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe { id, .. } => Some(id),
            _ => None,
        })
        .collect()
}

/// The JSON-RPC messages the engine sent to the device.
fn device_messages(out: &[Output]) -> Vec<serde_json::Value> {
    client(out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::DeviceMcp(m) => Some(m.to_value()),
            _ => None,
        })
        .collect()
}

#[test]
fn device_tool_through_mcp() {
    let mut d = Driver::new(text_only());
    assert_eq!(
        d.try_input(Input::DeviceMcp(json!({}))),
        Err(InputError::DeviceMcpNotStarted)
    );
    let sent = device_messages(&d.input(Input::DeviceMcpStart));
    assert_eq!(sent[0]["method"], "initialize");
    let init_id = sent[0]["id"].clone();
    let sent = device_messages(&d.input(Input::DeviceMcp(json!({
        "jsonrpc":"2.0","id":init_id,
        "result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},
                  "serverInfo":{"name":"xiaozhi","version":"2.0"}}
    }))));
    let list = sent.iter().find(|m| m["method"] == "tools/list").unwrap();
    d.input(Input::DeviceMcp(json!({
        "jsonrpc":"2.0","id":list["id"],
        "result":{"tools":[
            {"name":"self.audio_speaker.set_volume","description":"Set the volume",
             "inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}},
            {"name":"self.reboot","description":"Reboot","inputSchema":{"type":"object","properties":{}},
             "annotations":{"audience":["user"]}}
        ]}
    })));
    let (id, req) = generate(&d.input(text("louder please")));
    let ProviderRequest::Generate { tools, .. } = req else {
        unreachable!()
    };
    // User-only tools are never offered to the model.
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["self_audio_speaker_set_volume"]);
    let mut out = d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "v1".into(),
        name: "self_audio_speaker_set_volume".into(),
        arguments: json!({"volume": 80}),
    });
    out.extend(d.provider(done(id)));
    let sent = device_messages(&out);
    let call = sent.iter().find(|m| m["method"] == "tools/call").unwrap();
    assert_eq!(call["params"]["name"], "self.audio_speaker.set_volume");
    assert_eq!(call["params"]["arguments"]["volume"], 80);
    assert!(call["id"].is_number());
    let out = d.input(Input::DeviceMcp(json!({
        "jsonrpc":"2.0","id":call["id"],
        "result":{"content":[{"type":"text","text":"true"}],"isError":false}
    })));
    let (id2, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    let tool = messages.last().unwrap();
    assert_eq!((tool.role, tool.content.as_str()), (ChatRole::Tool, "true"));
    d.provider(delta(id2, "Volume is 80 now."));
    d.provider(done(id2));
    assert_eq!(
        d.engine.history().last().unwrap().text(),
        "Volume is 80 now."
    );
}

#[test]
fn direct_speech_preempts_and_can_stay_out_of_the_context() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(text("hi")));
    d.provider(delta(id, "Hello"));
    let out = d.input(Input::DirectSpeech {
        text: "Please hold. I am checking.".into(),
        include_in_history: false,
        uninterruptible: true,
    });
    assert!(requests(&out).contains(&ProviderRequest::Cancel { id }));
    let s = synth(&out);
    let texts: Vec<&str> = s.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["Please hold.", "I am checking."]);
    for (sid, _) in &s {
        d.provider(tts_audio(*sid, 300));
        d.provider(done(*sid));
    }
    // Uninterruptible: speech over it does not cut it off.
    let mut out = d.speak(&speech()[12_800..12_800 + 16_000 / 2]);
    out.extend(d.silence(600));
    d.advance(2000 * MS);
    // It was a cough: the recognizer hears nothing, and the floor goes back to nobody.
    for id in transcribes(&out) {
        d.provider(ProviderEvent::Transcript {
            id,
            text: String::new(),
            language: String::new(),
        });
    }
    assert_eq!(d.engine.state(), State::Idle);
    let spoken = d
        .engine
        .history()
        .iter()
        .find(|m| m.text() == "Please hold. I am checking.")
        .unwrap();
    assert!(spoken.ephemeral);
    assert_eq!(spoken.delivery, DeliveryStatus::Complete);
    let (_, req) = generate(&d.input(text("thanks")));
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    assert!(messages.iter().all(|m| !m.content.contains("Please hold")));
}

#[test]
fn history_export_awaits_the_pending_reply_and_can_exclude_audio() {
    let mut d = Driver::new(text_only());
    let mut out = d.speak(&speech());
    out.extend(d.silence(600));
    let asr: Vec<_> = requests(&out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for id in asr {
        out.extend(d.provider(ProviderEvent::Transcript {
            id,
            text: "hello".into(),
            language: String::new(),
        }));
    }
    out.extend(d.advance(1000 * MS));
    let (id, _) = generate(&out);
    // Immediate export: the reply is not there yet.
    let now = client(&d.input(Input::ExportHistory {
        await_pending: false,
        exclude_audio: false,
    }));
    let [ClientEvent::History { messages: h, .. }] = now.as_slice() else {
        panic!("{now:?}")
    };
    assert_eq!(h.len(), 1);
    assert!(matches!(&h[0].content[0], Content::InputAudio(a) if !a.samples.is_empty()));
    // Awaited export: answered when the reply is over.
    assert!(
        client(&d.input(Input::ExportHistory {
            await_pending: true,
            exclude_audio: true,
        }))
        .is_empty()
    );
    d.provider(delta(id, "Hi."));
    let out = d.provider(done(id));
    let events = client(&out);
    let ClientEvent::History { messages: h, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_eq!(h.len(), 2);
    assert!(
        matches!(&h[0].content[0], Content::InputAudio(a) if a.samples.is_empty() && a.transcription.starts_with("hello"))
    );
    assert_eq!(h[1].text(), "Hi.");
    assert_eq!(h[1].delivery, DeliveryStatus::Complete);
}

#[test]
fn conversation_queries_are_answered_in_order() {
    let mut d = Driver::new(text_only());
    let (id, _) = generate(&d.input(text("My name is Ada.")));
    d.provider(delta(id, "Nice to meet you, Ada."));
    d.provider(done(id));
    assert_eq!(
        d.try_input(Input::ConversationQuery {
            prompt: None,
            instructions: Some("  ".into())
        }),
        Err(InputError::EmptyQuery)
    );
    let q = |d: &mut Driver, prompt: &str| {
        let out = d.input(Input::ConversationQuery {
            prompt: Some(prompt.into()),
            instructions: Some("Answer in one word.".into()),
        });
        match requests(&out).as_slice() {
            [ProviderRequest::Query { id, messages }] => (*id, messages.clone()),
            other => panic!("{other:?}"),
        }
    };
    let (q1, messages) = q(&mut d, "What is the user's name?");
    assert_eq!(messages.len(), 5);
    assert_eq!(messages[3].role, ChatRole::System);
    assert_eq!(messages[4].content, "What is the user's name?");
    let (q2, _) = q(&mut d, "Mood?");
    // The second answer is ready first but waits for the first.
    d.provider(delta(q2, "Friendly"));
    assert!(client(&d.provider(done(q2))).is_empty());
    d.provider(delta(q1, "Ada"));
    let events = client(&d.provider(done(q1)));
    assert_eq!(
        events,
        [
            ClientEvent::QueryResult { text: "Ada".into() },
            ClientEvent::QueryResult {
                text: "Friendly".into()
            }
        ]
    );
    // Queries never enter the history.
    assert_eq!(d.engine.history().len(), 2);
}

#[test]
fn abort_cancels_and_later_provider_events_are_ignored() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(text("go on")));
    let s = synth(&d.provider(delta(id, "First sentence here. Second")));
    d.provider(tts_audio(s[0].0, 500));
    let out = d.input(Input::Abort);
    let events = client(&out);
    assert_eq!(events[0], ClientEvent::ClearPlayback);
    // The LLM stream and the sentence still being synthesized are cancelled.
    assert!(requests(&out).contains(&ProviderRequest::Cancel { id }));
    assert!(requests(&out).contains(&ProviderRequest::Cancel { id: s[0].0 }));
    assert_eq!(d.engine.state(), State::Idle);
    let mut late = d.provider(delta(id, " sentence."));
    late.extend(d.provider(tts_audio(s[0].0, 500)));
    late.extend(d.provider(done(s[0].0)));
    late.extend(d.provider(ProviderEvent::Failed {
        id,
        message: "stream reset".into(),
    }));
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(d.engine.stale_events(), 4);
}

#[test]
fn provider_failures_become_categorised_errors_and_the_turn_ends() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(text("hi")));
    let s = synth(&d.provider(delta(id, "One. Two. ")));
    d.provider(ProviderEvent::Failed {
        id: s[0].0,
        message: "tts down".into(),
    });
    d.provider(tts_audio(s[1].0, 200));
    d.provider(done(s[1].0));
    let out = d.provider(ProviderEvent::Failed {
        id,
        message: "llm down".into(),
    });
    d.advance(1000 * MS);
    let errors: Vec<_> = d
        .client_events()
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::Error { category, message } => Some((category, message)),
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        [
            (voxgate_engine::ErrorCategory::Tts, "tts down".to_owned()),
            (
                voxgate_engine::ErrorCategory::Inference,
                "llm down".to_owned()
            )
        ]
    );
    assert!(client(&out).contains(&ClientEvent::ResponseEnd {
        turn: d.engine.history()[1].turn.unwrap()
    }));
    assert_eq!(d.engine.history()[1].text(), "Two.");
    assert_eq!(d.engine.state(), State::Idle);
}

/// A model that fails before its first token still ends the turn: the client sees the error
/// inside a response that begins and ends, and the engine is ready for the next turn.
#[test]
fn a_generation_that_fails_at_once_still_ends_the_turn() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(text("hi")));
    d.provider(ProviderEvent::Failed {
        id,
        message: "connection refused".into(),
    });
    d.advance(1000 * MS);
    let events = d.client_events();
    let begin = events
        .iter()
        .position(|e| matches!(e, ClientEvent::ResponseBegin { .. }));
    let error = events
        .iter()
        .position(|e| matches!(e, ClientEvent::Error { .. }));
    let end = events
        .iter()
        .position(|e| matches!(e, ClientEvent::ResponseEnd { .. }));
    assert!(
        begin.is_some() && error.is_some() && end.is_some(),
        "{events:?}"
    );
    assert!(begin < error && error < end, "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ClientEvent::ResponseFinished { .. })),
        "{events:?}"
    );
    assert_eq!(d.engine.state(), State::Idle);
    // The next turn is served.
    let (next, _) = generate(&d.input(text("again")));
    assert_ne!(next, id);
}

/// A reply cut off mid-stream, after words were said, changes the face to the puzzled one, so
/// a device does not stay happy over a reply that broke off.
#[test]
fn a_reply_cut_mid_stream_turns_the_face_puzzled() {
    let mut d = Driver::new(EngineConfig {
        emotion: Some(EmojiPolicy::faces()),
        output_audio: None,
        ..EngineConfig::default()
    });
    let (id, _) = generate(&d.input(text("hi")));
    d.provider(ProviderEvent::TextDelta {
        id,
        delta: "🙂 Here is the first sentence. And then".into(),
    });
    d.provider(ProviderEvent::Failed {
        id,
        message: "stream cut".into(),
    });
    d.advance(1000 * MS);
    let events = d.client_events();
    let faces: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Emotion { emotion, .. } => Some(*emotion),
            _ => None,
        })
        .collect();
    assert_eq!(faces, [Emotion::Happy, Emotion::Confused], "{events:?}");
}

/// On a door with an emotion channel, a reply that failed before its first word shows a
/// puzzled face, not the default one, and says nothing.
#[test]
fn a_failed_reply_shows_a_puzzled_face() {
    let mut d = Driver::new(EngineConfig {
        emotion: Some(EmojiPolicy::faces()),
        ..EngineConfig::default()
    });
    let (id, _) = generate(&d.input(text("hi")));
    d.provider(ProviderEvent::Failed {
        id,
        message: "refused".into(),
    });
    d.advance(1000 * MS);
    let events = d.client_events();
    let faces: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Emotion { emotion, .. } => Some(*emotion),
            _ => None,
        })
        .collect();
    assert_eq!(faces, [Emotion::Confused], "{events:?}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ClientEvent::SentenceStart { .. })),
        "{events:?}"
    );
}
