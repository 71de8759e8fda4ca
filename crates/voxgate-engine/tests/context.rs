//! The context budget: long conversations keep the LLM context bounded by leaving out the
//! oldest exchanges, whole, and report each cycle's dropped turns once.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers may unwrap and panic

mod common;

use common::*;
use serde_json::json;
use voxgate_engine::history::DeliveryStatus;
use voxgate_engine::provider::{ChatRole, ContextMessage, ProviderEvent};
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, Output, ProviderRequest, ToolDefinition, TriggerMode, TurnId,
};

const SYSTEM: &str = "Be brief."; // 9 characters

fn budget(max_context_chars: usize) -> EngineConfig {
    EngineConfig {
        output_audio: None,
        system_prompt: SYSTEM.into(),
        max_context_chars,
        ..EngineConfig::default()
    }
}

fn text(t: &str) -> Input {
    Input::Text {
        text: t.into(),
        mode: TriggerMode::Queue,
    }
}

/// A 30-character message tagged `tag`.
fn msg(tag: &str) -> String {
    format!("{tag:-<30}")
}

fn messages(req: &ProviderRequest) -> Vec<ContextMessage> {
    match req {
        ProviderRequest::Generate { messages, .. } | ProviderRequest::Query { messages, .. } => {
            messages.clone()
        }
        other => panic!("not an LLM request: {other:?}"),
    }
}

fn contents(req: &ProviderRequest) -> Vec<String> {
    messages(req).into_iter().map(|m| m.content).collect()
}

fn size(req: &ProviderRequest) -> usize {
    messages(req)
        .iter()
        .map(|m| {
            m.content.chars().count()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.to_string().len())
                    .sum::<usize>()
        })
        .sum()
}

fn truncations(out: &[Output]) -> Vec<(Vec<TurnId>, TurnId)> {
    client(out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::ContextTruncated {
                truncated,
                response,
            } => Some((truncated, response)),
            _ => None,
        })
        .collect()
}

/// One text exchange: returns the outputs up to the `Generate` and that request.
fn exchange(d: &mut Driver, user: &str, reply: &str) -> (Vec<Output>, ProviderRequest) {
    let out = d.input(text(user));
    let (id, req) = generate(&out);
    d.provider(delta(id, reply));
    d.provider(done(id));
    (out, req)
}

/// Every tool result in a context follows the assistant message that made its call.
fn assert_calls_paired(req: &ProviderRequest) {
    let ms = messages(req);
    for (i, m) in ms.iter().enumerate() {
        if m.role == ChatRole::Tool {
            let id = m.tool_call_id.as_deref().unwrap();
            assert!(
                ms[..i]
                    .iter()
                    .any(|p| p.role == ChatRole::Assistant
                        && p.tool_calls.iter().any(|c| c.id == id)),
                "result {id} without its call in {ms:#?}"
            );
        }
        for c in &m.tool_calls {
            assert!(
                ms[i + 1..]
                    .iter()
                    .any(|r| r.tool_call_id.as_deref() == Some(c.id.as_str())),
                "call {} without its result in {ms:#?}",
                c.id
            );
        }
    }
}

#[test]
fn the_budget_drops_the_oldest_whole_exchanges_and_reports_each_once() {
    // 9 (system) + 60 per exchange + 30 for the new question: the third question no longer fits.
    let mut d = Driver::new(budget(150));
    let (out, r1) = exchange(&mut d, &msg("u1"), &msg("a1"));
    assert_eq!(contents(&r1), [SYSTEM.to_owned(), msg("u1")]);
    assert!(truncations(&out).is_empty());
    let (out, r2) = exchange(&mut d, &msg("u2"), &msg("a2"));
    assert_eq!(size(&r2), 99);
    assert!(truncations(&out).is_empty());

    let (out, r3) = exchange(&mut d, &msg("u3"), &msg("a3"));
    let h = d.engine.history().to_vec();
    let turn = |i: usize| h[i].turn.unwrap();
    assert_eq!(
        contents(&r3),
        [SYSTEM.to_owned(), msg("u2"), msg("a2"), msg("u3")]
    );
    assert!(size(&r3) <= 150);
    let response3 = turn(5);
    assert_eq!(truncations(&out), [(vec![turn(0), turn(1)], response3)]);
    // The event comes before the response it explains.
    let events = d.client_events();
    let at = |f: &dyn Fn(&ClientEvent) -> bool| events.iter().position(f).unwrap();
    assert!(
        at(&|e| matches!(e, ClientEvent::ContextTruncated { .. }))
            < at(&|e| *e == ClientEvent::ResponseBegin { turn: response3 })
    );

    // The next cycle reports only what it drops itself; the first exchange stays out.
    let (out, r4) = exchange(&mut d, &msg("u4"), &msg("a4"));
    let h = d.engine.history().to_vec();
    let response4 = h[7].turn.unwrap();
    assert_eq!(
        contents(&r4),
        [SYSTEM.to_owned(), msg("u3"), msg("a3"), msg("u4")]
    );
    assert_eq!(
        truncations(&out),
        [(vec![h[2].turn.unwrap(), h[3].turn.unwrap()], response4)]
    );

    // History keeps every message; the dropped ones say when they left the context.
    assert_eq!(h.len(), 8);
    let marks: Vec<Option<TurnId>> = h.iter().map(|m| m.truncated_at_response_turn).collect();
    assert_eq!(
        marks,
        [
            Some(response3),
            Some(response3),
            Some(response4),
            Some(response4),
            None,
            None,
            None,
            None
        ]
    );
    let out = d.input(Input::ExportHistory {
        await_pending: false,
        exclude_audio: true,
    });
    let exported = client(&out)
        .into_iter()
        .find_map(|e| match e {
            ClientEvent::History { messages: h, .. } => Some(h),
            _ => None,
        })
        .unwrap();
    assert_eq!(exported.len(), 8);
    assert_eq!(exported[0].truncated_at_response_turn, Some(response3));
    assert_eq!(exported[0].text(), msg("u1"));
}

#[test]
fn a_tool_call_leaves_the_context_with_its_result_and_the_newest_turn_always_stays() {
    // Smaller than the tool exchange alone: it must still be sent whole while it is the newest.
    let mut d = Driver::new(budget(60));
    d.input(Input::SetTools(vec![ToolDefinition {
        name: "weather.get".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type":"object","properties":{"city":{"type":"string"}}}),
    }]));
    exchange(&mut d, &msg("hello"), &msg("hi"));
    let out = d.input(text(&msg("weather in Paris?")));
    let (id, _) = generate(&out);
    d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "call-1".into(),
        name: "weather_get".into(),
        arguments: json!({"city": "Paris"}),
    });
    d.provider(done(id));
    let out = d.input(Input::ToolResult {
        id: "call-1".into(),
        result: msg("sunny"),
    });
    let (id2, follow) = generate(&out);
    assert_calls_paired(&follow);
    let roles: Vec<ChatRole> = messages(&follow).iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            ChatRole::System,
            ChatRole::User,
            ChatRole::Assistant,
            ChatRole::Tool
        ],
        "the follow-up keeps the question, the call and its result over budget"
    );
    assert!(size(&follow) > 60);
    d.provider(delta(id2, &msg("It is sunny")));
    d.provider(done(id2));

    // The next question pushes the whole tool exchange out: call, result and both replies.
    let (out, next) = exchange(&mut d, &msg("thanks"), &msg("welcome"));
    assert_calls_paired(&next);
    assert_eq!(contents(&next), [SYSTEM.to_owned(), msg("thanks")]);
    let h = d.engine.history().to_vec();
    let tool_turns: Vec<TurnId> = h[2..5].iter().map(|m| m.turn.unwrap()).collect();
    assert_eq!(tool_turns.len(), 3, "question, calling reply, follow-up");
    let [(truncated, response)] = truncations(&out).try_into().unwrap();
    assert_eq!(truncated, tool_turns);
    assert_eq!(Some(response), h[6].turn);
    assert!(
        h[2..5]
            .iter()
            .all(|m| m.truncated_at_response_turn == Some(response))
    );
}

#[test]
fn a_system_prompt_over_budget_keeps_itself_and_the_newest_question() {
    let long_prompt = "x".repeat(500);
    let mut d = Driver::new(EngineConfig {
        system_prompt: long_prompt.clone(),
        ..budget(100)
    });
    let (out, r1) = exchange(&mut d, &msg("u1"), &msg("a1"));
    assert_eq!(contents(&r1), [long_prompt.clone(), msg("u1")]);
    assert!(truncations(&out).is_empty());
    let (out, r2) = exchange(&mut d, &msg("u2"), &msg("a2"));
    assert_eq!(contents(&r2), [long_prompt, msg("u2")]);
    assert_eq!(truncations(&out).len(), 1);
}

#[test]
fn zero_means_unlimited() {
    let mut d = Driver::new(budget(0));
    let mut last = None;
    for i in 0..40 {
        let (out, req) = exchange(&mut d, &"q".repeat(1000), &format!("answer {i}"));
        assert!(truncations(&out).is_empty());
        last = Some(req);
    }
    // Every exchange is still there: 40 questions, 39 answers and the system prompt.
    assert_eq!(messages(&last.unwrap()).len(), 80);
    assert!(
        d.engine
            .history()
            .iter()
            .all(|m| m.truncated_at_response_turn.is_none())
    );
}

#[test]
fn the_default_budget_bounds_a_long_conversation() {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    });
    let mut dropped = 0;
    let mut largest = 0;
    for i in 0..100 {
        let (out, req) = exchange(&mut d, &"q".repeat(500), &format!("{i:a<500}"));
        dropped += truncations(&out).len();
        largest = largest.max(size(&req));
    }
    assert!(
        largest <= voxgate_engine::DEFAULT_MAX_CONTEXT_CHARS,
        "{largest}"
    );
    assert!(dropped > 0);
}

#[test]
fn a_conversation_query_uses_the_same_bound_without_dropping_anything() {
    let mut d = Driver::new(budget(150));
    exchange(&mut d, &msg("u1"), &msg("a1"));
    exchange(&mut d, &msg("u2"), &msg("a2"));
    // 9 + 120 + the 30-character question is over 150: the query leaves out the oldest
    // exchange too.
    let out = d.input(Input::ConversationQuery {
        prompt: Some(msg("what was asked?")),
        instructions: None,
    });
    assert!(truncations(&out).is_empty());
    let [query] = requests(&out).try_into().unwrap();
    assert_eq!(
        contents(&query),
        [
            SYSTEM.to_owned(),
            msg("u2"),
            msg("a2"),
            msg("what was asked?")
        ]
    );
    assert!(size(&query) <= 150);
    // Nothing was marked: a reply that fits still sees the first exchange.
    assert!(
        d.engine
            .history()
            .iter()
            .all(|m| m.truncated_at_response_turn.is_none())
    );
    let out = d.input(text("ok"));
    let (_, reply) = generate(&out);
    assert_eq!(contents(&reply)[1], msg("u1"));
    assert!(truncations(&out).is_empty());
}

#[test]
fn an_interrupted_reply_is_not_a_context_truncation() {
    let mut d = Driver::new(budget(0));
    let (id, _) = generate(&d.input(text("Tell me a long story.")));
    d.provider(delta(id, "Once upon a time"));
    let out = d.input(Input::Text {
        text: "Stop.".into(),
        mode: TriggerMode::Immediate,
    });
    assert!(truncations(&out).is_empty());
    let reply = d.engine.history()[1].clone();
    assert_eq!(reply.delivery, DeliveryStatus::Interrupted);
    assert_eq!(reply.truncated_at_response_turn, None);
    // The cut reply is still in the context of the next one.
    let (_, next) = generate(&out);
    assert!(contents(&next).contains(&reply.text()));
}
