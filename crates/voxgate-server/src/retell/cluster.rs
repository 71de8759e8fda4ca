//! Retell calls across instances (`[cluster]`): the instance holding a call's socket is in the
//! cluster directory, and the call's conversation (the tracker's snapshot: transcript position,
//! the pending response id, invoked tool calls; the call details) is saved in
//! `<prefix>:retell:<call_id>` at each turn boundary. A reconnect that a load balancer sends to
//! another instance within the resume window resumes from it, exactly as a reconnect to the same
//! instance resumes from the call parked in its registry.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use redis::AsyncCommands as _;
use tokio::sync::watch;

use super::registry::Registry;
use super::session::CallState;
use super::{RECONNECT_GRACE, RetellConfig, json_error};
use crate::cluster::{Cluster, DirectoryEntry, Kind};

/// How often a live call's saved conversation has its expiry pushed back: a call can go
/// minutes without a turn boundary, and its state must outlive its instance by the resume
/// window whenever that instance dies.
fn refresh_every(cluster: &Cluster) -> Duration {
    cluster.lease() / 3
}

fn key(cluster: &Cluster, call_id: &str) -> String {
    cluster.key_of(&["retell", call_id])
}

/// Before a socket gets `call_id` here: waits (up to the reconnect grace) while another live
/// instance holds the call's socket, adopts the conversation saved in the cluster store, and
/// enters this instance in the directory. With Redis unreachable the call is served from what
/// this instance knows (logged).
///
/// # Errors
/// 409 when another instance's socket keeps the call past the grace.
pub(super) async fn take_over(
    cluster: &Arc<Cluster>,
    registry: &Registry,
    cfg: &RetellConfig,
    call_id: &str,
    window: Duration,
) -> Result<DirectoryEntry, Response> {
    let deadline = tokio::time::Instant::now() + RECONNECT_GRACE;
    // Nobody else, a dead instance's leftover entry, or no Redis: go on.
    while let Ok(Some(holder)) = crate::cluster::live_holder(cluster, Kind::Retell, call_id).await {
        if tokio::time::Instant::now() >= deadline {
            tracing::info!(%call_id, %holder, "Retell upgrade refused: the call has a live socket on another instance");
            return Err(json_error(
                StatusCode::CONFLICT,
                "this call already has a live socket; a reconnect is accepted once it closes",
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let k = key(cluster, call_id);
    match cluster
        .op("retell_load", async move |c| {
            c.get::<_, Option<String>>(&k).await
        })
        .await
    {
        Ok(Some(json)) => {
            if let Some(state) = CallState::from_saved(cfg, call_id, &json)
                && registry.adopt(call_id, state, window)
            {
                tracing::info!(%call_id, "Retell call resumed from the cluster store");
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(%call_id, error = %e, "saved Retell call unavailable; resuming only what this instance knows");
        }
    }
    Ok(cluster.claim(Kind::Retell, call_id).await)
}

/// Writes the call's conversation each time the session publishes a new one (and pushes its
/// expiry back while the call lives); when the session ends, the saved state is kept for the
/// resume window.
pub(super) async fn save(
    cluster: Arc<Cluster>,
    call_id: String,
    window: Duration,
    mut latest: watch::Receiver<Option<String>>,
) {
    let k = key(&cluster, &call_id);
    let alive_ttl = window + cluster.lease();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut refresh = tokio::time::interval(refresh_every(&cluster));
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.tick().await;
    loop {
        tokio::select! {
            changed = latest.changed() => {
                if changed.is_err() {
                    break;
                }
                let Some(json) = latest.borrow_and_update().clone() else { continue };
                let kk = k.clone();
                let ttl = ms(alive_ttl);
                if let Err(e) = cluster
                    .op("retell_save", async move |c| {
                        c.set_options::<_, _, ()>(
                            &kk,
                            json,
                            redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(ttl)),
                        )
                        .await
                    })
                    .await
                {
                    tracing::warn!(%call_id, error = %e, "Retell call not saved to the cluster store");
                }
            }
            _ = refresh.tick() => {
                let kk = k.clone();
                let ttl = ms(alive_ttl);
                let _ = cluster
                    .op("retell_refresh", async move |c| c.pexpire::<_, bool>(&kk, ttl.try_into().unwrap_or(i64::MAX)).await)
                    .await;
            }
        }
    }
    let kk = k.clone();
    let ttl = ms(window).max(1);
    let _ = cluster
        .op("retell_refresh", async move |c| {
            c.pexpire::<_, bool>(&kk, ttl.try_into().unwrap_or(i64::MAX))
                .await
        })
        .await;
}
