//! The MCP tool hub across instances: each instance writes its own MCP connections' tools to
//! `<prefix>:mcp:<instance>` (renewed with the heartbeat, rewritten when they change), and
//! mirrors every other instance's connections into its own hub. A session anywhere sees every
//! tool; a call to a mirrored tool is routed (`mcp.call`) to the instance whose MCP server
//! offers it, which calls it and sends the result back.
//!
//! Tokens are never written to Redis: connections are scoped by the SHA-256 of their token
//! ([`token_digest`](crate::mcp_endpoint::hub::token_digest)).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands as _;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use voxgate_mcp::client::CallError;
use voxgate_mcp::model::CallToolResult;

use super::{Cluster, Reply, stopped};
use crate::mcp_endpoint::hub::{Command, ExportedConnection, McpHub};

/// How often the other instances' tools are read again (and this instance's written).
fn period(cluster: &Cluster) -> Duration {
    (cluster.lease() / 3).min(Duration::from_secs(1))
}

/// Largest tool list read from one instance, in bytes.
const MAX_EXPORT_BYTES: usize = 1 << 20;

/// Calls queued for one mirrored connection.
const QUEUE: usize = 32;

/// Keeps this instance's tools in Redis and the other instances' tools in `hub`.
pub(crate) async fn sync(cluster: Arc<Cluster>, hub: Arc<McpHub>, mut stop: watch::Receiver<bool>) {
    let mut changes = hub.subscribe();
    let mut tick = tokio::time::interval(period(&cluster));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // (instance, connection there) → (mirror id here, its tools as last seen)
    let mut mirrors: HashMap<(String, u64), (u64, ExportedConnection)> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = changes.changed() => if r.is_err() { break },
            () = stopped(&mut stop) => break,
        }
        publish(&cluster, &hub).await;
        if let Ok(others) = read_others(&cluster).await {
            apply(&cluster, &hub, &mut mirrors, others);
        }
    }
    for (id, _) in mirrors.into_values() {
        hub.remove_remote(id);
    }
    let key = cluster.key_of(&["mcp", cluster.instance()]);
    let _ = cluster
        .op("mcp_publish", async move |c| c.del::<_, i64>(&key).await)
        .await;
}

/// Writes this instance's own connections (an empty list when it has none).
async fn publish(cluster: &Cluster, hub: &McpHub) {
    let exported = serde_json::to_string(&hub.export()).unwrap_or_default();
    let key = cluster.key_of(&["mcp", cluster.instance()]);
    let lease = u64::try_from(cluster.lease().as_millis()).unwrap_or(u64::MAX);
    let _ = cluster
        .op("mcp_publish", async move |c| {
            c.set_options::<_, _, ()>(
                &key,
                exported,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(lease)),
            )
            .await
        })
        .await;
}

/// Every other live instance's connections.
async fn read_others(
    cluster: &Cluster,
) -> Result<Vec<(String, Vec<ExportedConnection>)>, super::ClusterError> {
    let others: Vec<String> = cluster
        .instances()
        .await?
        .into_iter()
        .filter(|i| i != cluster.instance())
        .collect();
    if others.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<String> = others.iter().map(|i| cluster.key_of(&["mcp", i])).collect();
    let lists: Vec<Option<String>> = cluster
        .op("mcp_read", async move |c| c.mget(&keys).await)
        .await?;
    Ok(others
        .into_iter()
        .zip(lists)
        .filter_map(|(instance, list)| {
            let list = list.filter(|l| l.len() <= MAX_EXPORT_BYTES)?;
            let conns: Vec<ExportedConnection> = serde_json::from_str(&list)
                .inspect_err(|e| tracing::warn!(%instance, error = %e, "MCP tools of an instance unreadable"))
                .ok()?;
            Some((instance, conns))
        })
        .collect())
}

/// Brings the mirrors in `hub` in line with what the other instances offer now.
fn apply(
    cluster: &Arc<Cluster>,
    hub: &McpHub,
    mirrors: &mut HashMap<(String, u64), (u64, ExportedConnection)>,
    others: Vec<(String, Vec<ExportedConnection>)>,
) {
    let mut seen = HashMap::new();
    for (instance, conns) in others {
        for conn in conns {
            seen.insert((instance.clone(), conn.id), conn);
        }
    }
    mirrors.retain(|key, (id, known)| match seen.get(key) {
        Some(now) if now == known => true,
        _ => {
            hub.remove_remote(*id);
            false
        }
    });
    for (key, conn) in seen {
        if mirrors.contains_key(&key) {
            continue;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let (id, rejected) = hub.register_remote(&key.0, &conn, tx);
        if !rejected.is_empty() {
            tracing::debug!(instance = %key.0, rejected = rejected.len(), "mirrored MCP tools left out");
        }
        tokio::spawn(forward(Arc::clone(cluster), key.0.clone(), conn.id, rx));
        mirrors.insert(key, (id, conn));
    }
}

/// Sends a mirrored connection's calls to its instance; ends when the mirror is removed.
async fn forward(
    cluster: Arc<Cluster>,
    instance: String,
    conn: u64,
    mut calls: mpsc::Receiver<Command>,
) {
    while let Some(Command::Call {
        name,
        arguments,
        timeout,
        reply,
    }) = calls.recv().await
    {
        let cluster = Arc::clone(&cluster);
        let instance = instance.clone();
        tokio::spawn(async move {
            let body = json!({
                "name": name,
                "arguments": arguments,
                "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            });
            let wait = timeout + cluster.request_timeout();
            let outcome = match cluster
                .call_within(&instance, "mcp.call", &conn.to_string(), body, wait)
                .await
            {
                Ok(r) if r.status == 200 => serde_json::from_value::<CallToolResult>(r.body)
                    .map_err(|e| CallError::BadResult(e.to_string())),
                Ok(r) if r.status == 504 => Err(CallError::Timeout),
                Ok(r) if r.status == 410 => Err(CallError::Closed),
                Ok(r) => Err(CallError::BadResult(
                    r.body["error"].as_str().unwrap_or("failed").to_owned(),
                )),
                Err(super::ClusterError::Timeout(..)) => Err(CallError::Timeout),
                Err(super::ClusterError::Gone(_)) => Err(CallError::Closed),
                Err(e) => Err(CallError::BadResult(e.to_string())),
            };
            let _ = reply.send(outcome);
        });
    }
}

/// Runs a call routed here on this instance's own connection `target`.
pub(crate) async fn call_here(hub: &McpHub, target: &str, body: Value) -> Reply {
    let error = |status: u16, message: &str| Reply::new(status, json!({"error": message}));
    let Some(commands) = target.parse().ok().and_then(|id| hub.local_commands(id)) else {
        return error(410, "the MCP connection is gone");
    };
    let (Some(name), Some(timeout_ms)) = (body["name"].as_str(), body["timeout_ms"].as_u64())
    else {
        return error(400, "unreadable routed tool call");
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sent = commands
        .send(Command::Call {
            name: name.to_owned(),
            arguments: body["arguments"].clone(),
            timeout: Duration::from_millis(timeout_ms),
            reply: tx,
        })
        .await;
    if sent.is_err() {
        return error(410, "the MCP connection is gone");
    }
    match tokio::time::timeout(
        Duration::from_millis(timeout_ms) + Duration::from_secs(1),
        rx,
    )
    .await
    {
        Ok(Ok(Ok(result))) => Reply::new(200, serde_json::to_value(result).unwrap_or_default()),
        Ok(Ok(Err(CallError::Timeout))) | Err(_) => {
            error(504, "the MCP server did not answer in time")
        }
        Ok(Ok(Err(CallError::Closed))) | Ok(Err(_)) => error(410, "the MCP connection is gone"),
        Ok(Ok(Err(e))) => error(502, &e.to_string()),
    }
}
