//! The MCP endpoint over real sockets: a tokio-tungstenite client plays the bridge and its MCP
//! server (the server speaks first as MCP client), and `/api/message` turns call its tools.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use serde_json::json;
use support::{
    HttpResponse, Running, WAIT, http, mcp_connect, mcp_server, post_json, recv_json, send_json,
    serve_calls, tool, wait_tools,
};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use voxgate_server::Config;

/// POSTs `body` to `path` from a task of its own, so the test can play the MCP server while
/// the request waits for it.
fn post_in_background(
    addr: SocketAddr,
    path: &'static str,
    body: Value,
) -> JoinHandle<HttpResponse> {
    tokio::spawn(async move { post_json(addr, path, &body).await })
}

/// The response to a request started with [`post_in_background`].
async fn response(request: JoinHandle<HttpResponse>) -> HttpResponse {
    tokio::time::timeout(WAIT, request).await.unwrap().unwrap()
}

#[tokio::test]
async fn handshake_paged_listing_ping_noise_and_a_call() {
    tokio::time::timeout(WAIT * 2, async {
        let server = Running::start(Config::default()).await;
        let mut ws = mcp_server(
            server.addr,
            "/mcp/?token=abc",
            "pager",
            &[
                vec![tool("echo", "Echo text")],
                vec![tool("weather.get", "Weather"), tool("big", "Large answers")],
            ],
        )
        .await;
        let names = wait_tools(server.addr, |n| n.len() == 3).await;
        assert_eq!(names, ["echo", "weather_get", "big"]);

        // Noise the bridge relays from its MCP server's stdout is ignored, not answered...
        ws.send(Message::Text("INFO: server started".into()))
            .await
            .unwrap();
        ws.send(Message::Text("   ".into())).await.unwrap();
        ws.send(Message::Binary(vec![0xff, 0x00].into()))
            .await
            .unwrap();
        // ...a JSON-RPC ping (with surrounding whitespace and newline) is answered...
        ws.send(Message::Text(
            "  {\"jsonrpc\":\"2.0\",\"id\":\"p1\",\"method\":\"ping\"}\n".into(),
        ))
        .await
        .unwrap();
        let pong = recv_json(&mut ws).await;
        assert_eq!(pong, json!({"jsonrpc":"2.0","id":"p1","result":{}}));
        // ...and a WebSocket ping gets a pong.
        ws.send(Message::Ping(b"hb".to_vec().into())).await.unwrap();
        let got_pong = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(Ok(Message::Pong(p))) = ws.next().await {
                    return p;
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(&got_pong[..], b"hb");

        // An operator call through the admin route; the reply is matched by id even after an
        // unrelated response and with a trailing newline.
        let call = post_in_background(
            server.addr,
            "/admin/mcp/call",
            json!({"name":"echo","arguments":{"text":"hi"}}),
        );
        let req = recv_json(&mut ws).await;
        assert_eq!(req["method"], "tools/call");
        assert_eq!(
            req["params"],
            json!({"name":"echo","arguments":{"text":"hi"}})
        );
        send_json(&mut ws, &json!({"jsonrpc":"2.0","id":987654,"result":{}})).await;
        let reply = json!({"jsonrpc":"2.0","id":req["id"],
            "result":{"content":[{"type":"text","text":"echo: hi"}],"isError":false}});
        ws.send(Message::Text(format!("{reply}\n").into()))
            .await
            .unwrap();
        let r = response(call).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["result"]["content"][0]["text"], "echo: hi");

        // A result of 1 MiB comes through.
        let call = post_in_background(
            server.addr,
            "/admin/mcp/call",
            json!({"name":"big","arguments":{"text":"x"}}),
        );
        let req = recv_json(&mut ws).await;
        let payload = "y".repeat(1 << 20);
        let reply = json!({"jsonrpc":"2.0","id":req["id"],
            "result":{"content":[{"type":"text","text":payload}]}});
        send_json(&mut ws, &reply).await;
        let r = response(call).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.json()["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .len(),
            1 << 20
        );

        let r = http(server.addr, "GET", "/metrics", &[], b"").await;
        assert!(r.body.contains("door=\"mcp\""), "{}", r.body);
        ws.close(None).await.unwrap();
        wait_tools(server.addr, <[String]>::is_empty).await;
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn tokens_are_checked_in_the_header_or_the_query() {
    tokio::time::timeout(WAIT, async {
        let mut config = Config::default();
        config.mcp.tokens = vec!["good".into()];
        let server = Running::start(config).await;
        assert_eq!(
            mcp_connect(server.addr, "/mcp?token=bad").await.err(),
            Some(401)
        );
        assert_eq!(mcp_connect(server.addr, "/mcp").await.err(), Some(401));
        let mut ws = mcp_connect(server.addr, "/mcp?token=good").await.unwrap();
        assert_eq!(recv_json(&mut ws).await["method"], "initialize");
        let mut ws2 = mcp_connect(server.addr, "/mcp/?token=good").await.unwrap();
        assert_eq!(recv_json(&mut ws2).await["method"], "initialize");
        // A prefix or an extension of a token is not the token.
        for partial in ["goo", "goodx", "GOOD"] {
            let path = format!("/mcp?token={partial}");
            assert_eq!(mcp_connect(server.addr, &path).await.err(), Some(401));
        }
        // The header form keeps the token out of URLs (and proxy logs); it wins over the query.
        let url = format!("ws://{}/mcp", server.addr);
        let good = [("authorization", "Bearer good")];
        let mut ws3 = support::try_connect(&url, &good, WAIT).await.unwrap();
        assert_eq!(recv_json(&mut ws3).await["method"], "initialize");
        let bad = [("authorization", "Bearer bad")];
        let url_good_query = format!("ws://{}/mcp?token=good", server.addr);
        assert!(
            support::try_connect(&url_good_query, &bad, WAIT)
                .await
                .is_err()
        );
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn connections_merge_and_a_closed_one_takes_its_tools() {
    tokio::time::timeout(WAIT * 2, async {
        let server = Running::start(Config::default()).await;
        let mut a = mcp_server(
            server.addr,
            "/mcp?token=t",
            "a",
            &[vec![tool("echo", "A's echo"), tool("lamp.on", "Lamp")]],
        )
        .await;
        let mut b = mcp_server(
            server.addr,
            "/mcp?token=t",
            "b",
            &[vec![tool("echo", "B's echo")]],
        )
        .await;
        let names = wait_tools(server.addr, |n| n.len() == 3).await;
        assert_eq!(names, ["echo", "lamp_on", "echo_2"]);
        let r = http(server.addr, "GET", "/admin/sessions", &[], b"").await;
        let v = r.json();
        assert_eq!(v["sessions"]["mcp"], 2);
        let servers: Vec<&str> = v["mcp_connections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["server"].as_str().unwrap())
            .collect();
        assert_eq!(servers, ["a 1.0", "b 1.0"]);

        // `echo_2` is B's tool: the call goes to B.
        let call = post_in_background(
            server.addr,
            "/admin/mcp/call",
            json!({"name":"echo_2","arguments":{"text":"to b"}}),
        );
        let seen = serve_calls(&mut b, 1).await;
        assert_eq!(seen[0]["params"]["name"], "echo");
        let r = response(call).await;
        assert_eq!(r.json()["result"]["content"][0]["text"], "echo: to b");

        // A call in flight when its connection drops fails at once.
        let call = post_in_background(
            server.addr,
            "/admin/mcp/call",
            json!({"name":"lamp_on","arguments":{"text":"x"}}),
        );
        assert_eq!(recv_json(&mut a).await["method"], "tools/call");
        drop(a);
        let r = response(call).await;
        assert_eq!(r.status, 502, "{}", r.body);
        let names = wait_tools(server.addr, |n| n.len() == 1).await;
        // B's echo takes the plain name now.
        assert_eq!(names, ["echo"]);
        b.close(None).await.unwrap();
        wait_tools(server.addr, <[String]>::is_empty).await;
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn calls_time_out_and_bad_initialize_closes() {
    tokio::time::timeout(WAIT * 2, async {
        let mut config = Config::default();
        config.mcp.call_timeout_secs = 1;
        config.mcp.request_timeout_secs = 1;
        let server = Running::start(config).await;
        let mut ws = mcp_server(server.addr, "/mcp", "slow", &[vec![tool("echo", "Echo")]]).await;
        wait_tools(server.addr, |n| n.len() == 1).await;
        let t0 = std::time::Instant::now();
        let r = post_json(
            server.addr,
            "/admin/mcp/call",
            &json!({"name":"echo","arguments":{"text":"x"}}),
        )
        .await;
        assert_eq!(r.status, 502);
        assert!(
            r.json()["detail"].as_str().unwrap().contains("in time"),
            "{}",
            r.body
        );
        assert!(t0.elapsed() < Duration::from_secs(4));
        // A late reply is ignored; the connection goes on.
        let req = recv_json(&mut ws).await;
        send_json(
            &mut ws,
            &json!({"jsonrpc":"2.0","id":req["id"],"result":{"content":[]}}),
        )
        .await;
        send_json(&mut ws, &json!({"jsonrpc":"2.0","id":"x","method":"ping"})).await;
        assert_eq!(recv_json(&mut ws).await["result"], json!({}));

        // A server that is slow to start gets `initialize` again; one that never answers is
        // dropped after three attempts.
        let mut slow = mcp_connect(server.addr, "/mcp").await.unwrap();
        let first = recv_json(&mut slow).await;
        assert_eq!(first["method"], "initialize");
        let second = recv_json(&mut slow).await;
        assert_eq!(second["method"], "initialize");
        assert_ne!(first["id"], second["id"]);
        // The late answer to the first is ignored; the second one counts.
        for id in [&first["id"], &second["id"]] {
            send_json(
                &mut slow,
                &json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":"2024-11-05",
                    "capabilities":{},"serverInfo":{"name":"late","version":"0"}}}),
            )
            .await;
        }
        assert_eq!(
            recv_json(&mut slow).await["method"],
            "notifications/initialized"
        );
        assert_eq!(recv_json(&mut slow).await["method"], "tools/list");

        let mut silent = mcp_connect(server.addr, "/mcp").await.unwrap();
        for _ in 0..3 {
            assert_eq!(recv_json(&mut silent).await["method"], "initialize");
        }
        let closed = tokio::time::timeout(WAIT, async {
            loop {
                match silent.next().await {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    _ => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok());
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn api_message_turn_calls_an_external_mcp_tool() {
    tokio::time::timeout(WAIT * 2, async {
        let server = Running::start(Config::default()).await;
        let mut ws = mcp_server(
            server.addr,
            "/mcp?token=t",
            "tools",
            &[vec![tool("text.echo", "Echo text back")]],
        )
        .await;
        wait_tools(server.addr, |n| n == ["text_echo"]).await;
        // DemoAgent calls a tool when told `call <name> <JSON>`; the model sees `text_echo`.
        let turn = post_in_background(
            server.addr,
            "/api/message",
            json!({"content":"call text_echo {\"text\":\"ping pong\"}","channel":"web"}),
        );
        let seen = serve_calls(&mut ws, 1).await;
        assert_eq!(
            seen[0]["params"],
            json!({"name":"text.echo","arguments":{"text":"ping pong"}})
        );
        let r = response(turn).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["tools_called"], json!(["text_echo"]));
        let text = v["response"].as_str().unwrap();
        assert!(
            text.contains("The tool text_echo returned: echo: ping pong"),
            "{text}"
        );

        // Schema violations never reach the MCP server; the model is told instead.
        let r = post_json(
            server.addr,
            "/api/message",
            &json!({"content":"call text_echo {\"text\":5}","channel":"web"}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let text = r.json()["response"].as_str().unwrap().to_owned();
        assert!(
            text.contains("invalid_arguments") || text.contains("schema"),
            "{text}"
        );
        // Nothing arrived on the socket meanwhile except what we ask for next.
        send_json(&mut ws, &json!({"jsonrpc":"2.0","id":1,"method":"ping"})).await;
        assert_eq!(recv_json(&mut ws).await["id"], 1);

        // Without a connection the tool is gone from the model's list.
        ws.close(None).await.unwrap();
        wait_tools(server.addr, <[String]>::is_empty).await;
        let r = post_json(
            server.addr,
            "/api/message",
            &json!({"content":"call text_echo {\"text\":\"x\"}","channel":"web"}),
        )
        .await;
        let text = r.json()["response"].as_str().unwrap().to_owned();
        assert!(text.contains("I do not know a tool called"), "{text}");
        server.stop().await;
    })
    .await
    .unwrap();
}
