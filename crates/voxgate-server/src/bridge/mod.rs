//! The Bridge HTTP API: `POST /api/message` (text in, the agent's reply out), `POST
//! /api/perception/event` feeding the perception event bus, and localhost-only `/admin/*`.
//!
//! | route | what |
//! |---|---|
//! | `POST /api/message` | `{"content", "channel"?, "session_id"?}` → `{"response"}`: one text turn through the configured LLM with the MCP endpoint's tools; history kept per `channel:session_id` |
//! | `POST /api/perception/event` | `{"name", "data"?, "device_id", "session_id"?, "ts"?}` → `{"ok":true}`, published on the [perception bus](perception) |
//! | `GET /api/perception/events` | the bus as Server-Sent Events (one `perception` event per bus event) |
//! | `GET /admin/sessions` | open sessions (door, age, state, last turn's latency) and counts by door, conversations, bus subscribers, MCP connections |
//! | `GET /admin/sessions/{id}` | one open session and its recent turn timeline |
//! | `GET /admin/cluster` | with `[cluster]`: this instance, the live instances, what it holds in Redis, its Redis operations' latencies |
//! | `GET /admin/perception[/{device_id}]` | per-device perception state |
//! | `POST /admin/perception/event` | publish a test event |
//! | `GET /admin/conversations`, `POST /admin/conversations/clear` | list / forget `/api/message` histories |
//! | `GET /admin/mcp/tools`, `POST /admin/mcp/call` | the MCP endpoint's tools; call one |
//!
//! `/api/*` requires `Authorization: Bearer <token>` when `[bridge] tokens` is set. `/admin/*`
//! follows the operator-surface rule of [`crate::access`] (`docs/security.md`): with `[admin]
//! tokens` set, one of them from every client (`[bridge] tokens` then do not open it); without,
//! only local requests (a loopback peer that is not a trusted proxy, no forwarding header),
//! which also need a `[bridge]` token when those are set. Errors are JSON: `{"ok":false,"error":"<code>","detail":"..."}`
//! with 400 (bad JSON or fields), 401, 403, 404, 405, 413, 500 (the LLM failed), 503 (shutting
//! down, every conversation busy) and 504 (the turn timed out).
//!
//! For the emoji channels (`stackchan` by default) the model is told to start with one of the
//! allowed faces and the reply is made to start with one: a missing or disallowed leading emoji
//! becomes the default face (😐), as the original bridge's `_ensure_emoji_prefix` did.

mod conversation;
pub(crate) mod perception;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use voxgate_engine::emotion::EmojiPolicy;

use crate::access::{self, Origin, Refusal};
use crate::config::env::{EnvVars, Secret};
use crate::config::{Config, ConfigError};
use crate::mcp_endpoint::hub::{McpHub, Scope};
use crate::metrics::Door;
use crate::server::App;
use conversation::{Conversations, Persona, TurnContext, TurnError};
use perception::{EventOrigin, PerceptionBus, PerceptionEvent};

/// The seed bridge's nine faces.
const BRIDGE_EMOJI: [&str; 9] = ["😊", "😆", "😢", "😮", "🤔", "😠", "😐", "😍", "😴"];

/// Settings of this door (`[bridge]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BridgeConfig {
    /// Bearer tokens accepted on `/api/*` (and on `/admin/*` while `[admin] tokens` is empty);
    /// empty means no authentication.
    pub tokens: Vec<String>,
    /// Channels whose replies must start with an allowed emoji (the original: `stackchan`).
    pub emoji_channels: Vec<String>,
    /// The faces allowed at the start of an emoji channel's reply.
    pub emoji_allowlist: Vec<String>,
    /// The face put in front of a reply without an allowed one.
    pub default_emoji: String,
    /// The system prompt of `/api/message` conversations.
    pub system_prompt: String,
    /// Offer the MCP endpoint's tools to `/api/message` turns.
    pub mcp_tools: bool,
    /// Offer only the tools of MCP connections with this token (`None`: every connection's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_token: Option<String>,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Seconds a turn may take, tool calls included.
    pub turn_timeout_secs: u64,
    /// Conversations kept; the least recently used idle one is forgotten beyond this.
    pub max_conversations: usize,
    /// Seconds after which an unused conversation is forgotten.
    pub conversation_idle_secs: u64,
    /// `[bridge.engine]`: engine settings for this door, over `[engine]`: only `max_context_chars`.
    #[serde(skip_serializing_if = "crate::config::EngineSettings::is_empty")]
    pub engine: crate::config::EngineSettings,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            emoji_channels: vec!["stackchan".into()],
            emoji_allowlist: BRIDGE_EMOJI.iter().map(|e| (*e).to_owned()).collect(),
            default_emoji: "😐".into(),
            system_prompt: "You are a friendly voice assistant. Answer briefly, in plain \
                spoken sentences."
                .into(),
            mcp_tools: true,
            mcp_token: None,
            max_body_bytes: 64 << 10,
            turn_timeout_secs: 60,
            max_conversations: 1024,
            conversation_idle_secs: 3600,
            engine: crate::config::EngineSettings::default(),
        }
    }
}

impl BridgeConfig {
    /// Applies the door's `VOXGATE_BRIDGE_*` environment overrides: `VOXGATE_BRIDGE_TOKENS`
    /// and `VOXGATE_BRIDGE_EMOJI_CHANNELS` (comma-separated), `VOXGATE_BRIDGE_SYSTEM_PROMPT`,
    /// `VOXGATE_BRIDGE_MCP_TOKEN`, `VOXGATE_BRIDGE_MAX_BODY_BYTES`,
    /// `VOXGATE_BRIDGE_TURN_TIMEOUT_SECS`.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.list("VOXGATE_BRIDGE_TOKENS", &mut self.tokens);
        vars.list("VOXGATE_BRIDGE_EMOJI_CHANNELS", &mut self.emoji_channels);
        vars.string("VOXGATE_BRIDGE_SYSTEM_PROMPT", &mut self.system_prompt);
        vars.non_blank("VOXGATE_BRIDGE_MCP_TOKEN", &mut self.mcp_token);
        // Parsed as u64 and saturated, so a huge value means "no limit" on any target.
        if let Some(n) = vars.get::<u64>("VOXGATE_BRIDGE_MAX_BODY_BYTES")? {
            self.max_body_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        vars.parsed(
            "VOXGATE_BRIDGE_TURN_TIMEOUT_SECS",
            &mut self.turn_timeout_secs,
        )?;
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.tokens.mask();
        self.mcp_token.mask();
    }

    /// Rejects values out of range.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.turn_timeout_secs == 0 {
            return Err(ConfigError::Invalid(
                "[bridge] turn_timeout_secs must be at least 1".into(),
            ));
        }
        if self.max_body_bytes < 256 {
            return Err(ConfigError::Invalid(format!(
                "[bridge] max_body_bytes = {} is below the minimum of 256",
                self.max_body_bytes
            )));
        }
        if self.default_emoji.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "[bridge] default_emoji must not be empty".into(),
            ));
        }
        Ok(())
    }

    fn persona(&self, channel: &str, max_history_messages: usize) -> Persona {
        if !self.emoji_channels.iter().any(|c| c == channel) {
            return Persona {
                system_prompt: self.system_prompt.clone(),
                emoji: None,
                max_history_messages,
                engine: self.engine.clone(),
            };
        }
        let policy = EmojiPolicy::new(self.emoji_allowlist.iter().cloned(), &*self.default_emoji);
        let faces = policy.allowed().map(|a| a.join(" ")).unwrap_or_default();
        // The original wrapped each user message in an English+emoji "sandwich"; the same
        // instruction goes into the system prompt here, so history keeps the user's words.
        let system_prompt = format!(
            "{}\nAlways answer in English. Start every reply with exactly one of these emoji \
             that fits your mood: {faces}, then a space, then your answer. Use no other emoji.",
            self.system_prompt
        );
        Persona {
            system_prompt: system_prompt.trim_start().to_owned(),
            emoji: Some(policy),
            max_history_messages,
            engine: self.engine.clone(),
        }
    }
}

/// State every door shares across sessions: [`App::shared`].
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    /// The perception event bus and per-device state.
    pub(crate) perception: Arc<PerceptionBus>,
    /// The MCP endpoint's tool hub.
    pub(crate) mcp: Arc<McpHub>,
    /// `/api/message` conversations.
    conversations: Arc<Conversations>,
    /// The Xiaozhi door's device activations (pending codes, activated devices).
    pub(crate) xiaozhi: Arc<crate::xiaozhi::DoorState>,
    /// Xiaozhi devices connected to this instance, for pushes.
    pub(crate) xiaozhi_devices: Arc<crate::xiaozhi::devices::Devices>,
    /// The Retell calls this instance knows (live or parked for a reconnect); one registry per
    /// server, so several servers in one process keep their calls apart.
    pub(crate) retell_calls: Arc<crate::retell::registry::Registry>,
}

impl Shared {
    /// Empty state sized by `config`.
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            perception: Arc::new(PerceptionBus::new()),
            mcp: Arc::new(McpHub::new()),
            conversations: Arc::new(Conversations::new(
                config.bridge.max_conversations,
                Duration::from_secs(config.bridge.conversation_idle_secs),
            )),
            xiaozhi: Arc::new(crate::xiaozhi::DoorState::load(&config.xiaozhi)),
            xiaozhi_devices: Arc::default(),
            retell_calls: Arc::new(crate::retell::registry::Registry::with_parked_bytes(
                config.retell.max_parked_call_bytes,
                config.retell.max_parked_bytes,
            )),
        }
    }
}

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/message", post(message).fallback(method_not_allowed))
        .route(
            "/api/perception/event",
            post(perception_event).fallback(method_not_allowed),
        )
        .route(
            "/api/perception/events",
            get(perception_stream).fallback(method_not_allowed),
        )
        .route("/api/{*rest}", any(not_found))
        .route("/admin/sessions", get(admin_sessions))
        .route("/admin/cluster", get(admin_cluster))
        .route("/admin/sessions/{id}", get(admin_session))
        .route("/admin/perception", get(admin_perception))
        .route(
            "/admin/perception/event",
            post(admin_publish).fallback(method_not_allowed),
        )
        .route("/admin/perception/{device_id}", get(admin_device))
        .route("/admin/conversations", get(admin_conversations))
        .route("/admin/conversations/clear", post(admin_clear))
        .route("/admin/mcp/tools", get(admin_tools))
        .route("/admin/mcp/call", post(admin_call))
        .route("/admin", any(admin_not_found))
        .route("/admin/{*rest}", any(admin_not_found))
}

// ---- errors and helpers ---------------------------------------------------------------------

/// A JSON error response.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    detail: String,
    /// `Retry-After` seconds, for refusals that pass.
    retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
        }
    }

    fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// The error another instance answered a routed request with, passed on as it was.
    fn routed(status: u16, body: &Value) -> Self {
        let code = match body["error"].as_str() {
            Some("bad_request") => "bad_request",
            Some("timeout") => "timeout",
            Some("busy") => "busy",
            Some("refused") => "refused",
            Some("provider_failed") => "provider_failed",
            _ => "routed_request_failed",
        };
        Self::new(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            code,
            body["detail"].as_str().unwrap_or_default(),
        )
    }

    /// This error as a routed request's reply.
    pub(crate) fn into_reply(self) -> crate::cluster::Reply {
        crate::cluster::Reply::new(
            self.status.as_u16(),
            json!({"ok": false, "error": self.code, "detail": self.detail}),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"ok": false, "error": self.code, "detail": self.detail});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        let (status, code, retry_after) = match &e {
            TurnError::Provider(_) => (StatusCode::INTERNAL_SERVER_ERROR, "provider_failed", None),
            TurnError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout", None),
            TurnError::Refused(_) => (StatusCode::BAD_REQUEST, "refused", None),
            TurnError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy", None),
            TurnError::Admission(r) => (r.status(), "busy", Some(r.retry_after_secs())),
            TurnError::AgentsBusy(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                Some(conversation::AGENTS_BUSY_RETRY_SECS),
            ),
        };
        let mut error = Self::new(status, code, e.to_string());
        error.retry_after = retry_after;
        error
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok_json(v: Value) -> ApiResult {
    Ok(axum::Json(v).into_response())
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// Checks the bearer token when tokens are configured.
fn authorize(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let tokens = &app.config.bridge.tokens;
    if tokens.is_empty() {
        return Ok(());
    }
    let given = access::bearer(headers);
    match given {
        Some(t) if crate::secret::matches_any(tokens, t) => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown token",
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing Authorization: Bearer <token>",
        )),
    }
}

fn shutting_down(app: &App) -> Result<(), ApiError> {
    if *app.shutdown.borrow() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        ));
    }
    Ok(())
}

/// Reads the body (bounded) and parses it as JSON.
async fn json_body(app: &App, body: Body, headers: &HeaderMap) -> Result<Value, ApiError> {
    let limit = app.config.bridge.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body exceeds {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes: Bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    serde_json::from_slice(&bytes).map_err(bad_json)
}

/// The 400 for a malformed perception event, 413 for one whose `data` is too large.
#[allow(
    clippy::needless_pass_by_value,
    reason = "map_err hands the error over by value"
)]
fn event_refused(e: perception::InvalidEvent) -> ApiError {
    if e.too_large() {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.0)
    } else {
        ApiError::bad_request(e.0)
    }
}

/// The 400 for a body that is not JSON (a `map_err` adapter, hence the owned error).
#[allow(
    clippy::needless_pass_by_value,
    reason = "map_err hands the error over by value"
)]
fn bad_json(e: serde_json::Error) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_json", format!("{e}"))
}

fn optional_string(v: &Value, key: &str) -> Result<Option<String>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be a string"))),
    }
}

// ---- /api -----------------------------------------------------------------------------------

async fn message(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> ApiResult {
    let (parts, body) = request.into_parts();
    authorize(&app, &parts.headers)?;
    shutting_down(&app)?;
    let v = json_body(&app, body, &parts.headers).await?;
    ok_json(message_turn(&app, &v, Some(peer.ip())).await?)
}

/// One `/api/message` turn for the request body `v` from `peer`: on this instance, or (with
/// `[cluster]`, unless the request was already routed here, `peer` then `None`) on the
/// instance that holds the conversation, so a conversation keeps one history whichever
/// instance a load balancer picks.
async fn message_turn(app: &App, v: &Value, peer: Option<IpAddr>) -> Result<Value, ApiError> {
    let routed = peer.is_none();
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let content = optional_string(v, "content")?
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("`content` is required (a non-empty string)"))?;
    let channel = optional_string(v, "channel")?.unwrap_or_else(|| "default".into());
    let session = optional_string(v, "session_id")?.unwrap_or_else(|| "default".into());
    let key = format!("{channel}:{session}");
    let cfg = &app.config.bridge;
    let turn_timeout = Duration::from_secs(cfg.turn_timeout_secs);
    if let Some(cluster) = app.cluster.as_ref().filter(|_| !routed)
        && app.shared.conversations.get(&key).is_none()
        && let Ok(Some(holder)) =
            crate::cluster::live_holder(cluster, crate::cluster::Kind::Bridge, &key).await
    {
        let wait = turn_timeout + cluster.request_timeout();
        return match cluster
            .call_within(&holder, "bridge.message", &key, v.clone(), wait)
            .await
        {
            Ok(r) if r.status == 200 => Ok(r.body),
            Ok(r) => Err(ApiError::routed(r.status, &r.body)),
            Err(e) => Err(ApiError::new(
                StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY),
                e.code(),
                e.to_string(),
            )),
        };
    }
    let conversation = app.shared.conversations.get_or_create(&key, || {
        let mut persona = cfg.persona(&channel, app.config.limits.max_history_messages);
        persona.engine = persona.engine.over(&app.config.engine);
        persona
    })?;
    let ctx = TurnContext {
        providers: app.providers.for_bridge(),
        metrics: &app.metrics,
        hub: &app.shared.mcp,
        tools: cfg
            .mcp_tools
            .then(|| Scope::from_option(cfg.mcp_token.as_deref())),
        tool_timeout: app.config.mcp.call_timeout(),
        timeout: turn_timeout,
        admission: &app.admission,
        // A routed request's client is another instance's: its agent is counted as one
        // address's (the unspecified one).
        peer: peer.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
    };
    // Requests of one conversation take turns; others run in parallel.
    let mut conversation = conversation.lock().await;
    if let Some(cluster) = &app.cluster
        && conversation.directory.is_none()
    {
        conversation.directory = Some(cluster.claim(crate::cluster::Kind::Bridge, &key).await);
    }
    let reply = conversation.turn(&ctx, content).await?;
    Ok(json!({
        "response": reply.text,
        "session_id": session,
        "tools_called": reply.tools_called,
    }))
}

/// A `/api/message` turn another instance routed here (its conversation is here).
pub(crate) async fn routed_message(app: &App, body: &Value) -> crate::cluster::Reply {
    match message_turn(app, body, None).await {
        Ok(v) => crate::cluster::Reply::new(200, v),
        Err(e) => e.into_reply(),
    }
}

async fn perception_event(State(app): State<Arc<App>>, request: Request) -> ApiResult {
    let (parts, body) = request.into_parts();
    authorize(&app, &parts.headers)?;
    shutting_down(&app)?;
    let v = json_body(&app, body, &parts.headers).await?;
    let event =
        PerceptionEvent::from_value(v, None, None, EventOrigin::Http).map_err(event_refused)?;
    app.shared.perception.publish(event);
    ok_json(json!({"ok": true}))
}

async fn perception_stream(State(app): State<Arc<App>>, headers: HeaderMap) -> ApiResult {
    authorize(&app, &headers)?;
    shutting_down(&app)?;
    let rx = app.shared.perception.subscribe();
    let shutdown = app.shutdown.clone();
    let stream = futures::stream::unfold((rx, shutdown), |(mut rx, mut shutdown)| async move {
        let event = tokio::select! {
            r = rx.recv() => r,
            _ = shutdown.wait_for(|s| *s) => return None,
        };
        let sse = match event {
            Ok(e) => Event::default()
                .event("perception")
                .data(serde_json::to_string(&*e).unwrap_or_default()),
            // A listener that fell behind is told how many events it missed.
            Err(broadcast::error::RecvError::Lagged(n)) => {
                Event::default().event("lagged").data(n.to_string())
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(sse), (rx, shutdown)))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

// ---- /admin ---------------------------------------------------------------------------------

/// `/admin/*` is for the operator: with `[admin] tokens`, whoever has one; without, the
/// machine the server runs on (a local request, see [`crate::access`]), with a `[bridge]`
/// token when those are set.
fn admin_guard(app: &App, peer: SocketAddr, headers: &HeaderMap) -> Result<(), ApiError> {
    let origin = Origin::resolve(&app.config.trusted_proxies, peer.ip(), headers);
    let tokens = &app.config.admin.tokens;
    if let Err(refusal) = access::check(&origin, tokens, headers) {
        tracing::debug!(
            peer = %origin.peer,
            client = origin.client.map(tracing::field::display),
            ?refusal,
            "/admin refused"
        );
        let (code, detail) = match refusal {
            Refusal::NotLocal => (
                "forbidden",
                "/admin is only served to localhost; set [admin] tokens to reach it otherwise",
            ),
            Refusal::MissingToken => (
                "unauthorized",
                "missing Authorization: Bearer <admin token>",
            ),
            Refusal::WrongToken => ("unauthorized", "unknown token"),
        };
        return Err(ApiError::new(refusal.status(), code, detail));
    }
    if tokens.is_empty() {
        authorize(app, headers)?;
    }
    Ok(())
}

/// The app, for an `/admin/*` handler, once `admin_guard` let the request through: refused
/// requests get its JSON error before the handler runs (or reads a body).
#[derive(Debug)]
pub(crate) struct Admin(pub(crate) Arc<App>);

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        let ConnectInfo(peer) = ConnectInfo::<SocketAddr>::from_request_parts(parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        admin_guard(app, peer, &parts.headers).map_err(IntoResponse::into_response)?;
        Ok(Self(Arc::clone(app)))
    }
}

async fn admin_not_found(_: Admin) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such admin route")
}

/// Open sessions `GET /admin/sessions` lists at most (oldest first); `open_total` says how
/// many there are.
const MAX_LISTED_SESSIONS: usize = 1000;

/// `GET /admin/cluster`: this instance, the instances alive, what it holds in Redis and its
/// Redis operations' counts and latencies; 404 without `[cluster]`.
async fn admin_cluster(Admin(app): Admin) -> Response {
    match &app.cluster {
        Some(c) => axum::Json(c.describe().await).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "no_cluster",
            "this server runs alone ([cluster] redis_url is not set)",
        )
        .into_response(),
    }
}

async fn admin_sessions(Admin(app): Admin) -> ApiResult {
    let sessions: serde_json::Map<String, Value> = Door::ALL
        .iter()
        .map(|d| (d.label().to_owned(), app.metrics.active_sessions(*d).into()))
        .collect();
    let (open, open_total) = app.sessions.registry.list(MAX_LISTED_SESSIONS);
    ok_json(json!({
        "open": open,
        "open_total": open_total,
        "sessions": sessions,
        "conversations": app.shared.conversations.list(),
        "perception_subscribers": app.shared.perception.subscribers(),
        "mcp_connections": app.shared.mcp.connections(),
    }))
}

async fn admin_session(Admin(app): Admin, Path(id): Path<String>) -> ApiResult {
    match app.sessions.registry.get(&id) {
        Some(detail) => ok_json(json!(detail)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no open session {id:?}"),
        )),
    }
}

async fn admin_perception(Admin(app): Admin) -> ApiResult {
    ok_json(json!({"devices": app.shared.perception.devices()}))
}

async fn admin_device(Admin(app): Admin, Path(device_id): Path<String>) -> ApiResult {
    match app.shared.perception.device(&device_id) {
        Some(state) => ok_json(json!(state)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no events from device {device_id:?}"),
        )),
    }
}

async fn admin_publish(Admin(app): Admin, headers: HeaderMap, body: Body) -> ApiResult {
    let v = json_body(&app, body, &headers).await?;
    let event = PerceptionEvent::from_value(v, Some("admin"), None, EventOrigin::Admin)
        .map_err(event_refused)?;
    let delivered = app.shared.perception.publish(event);
    ok_json(json!({"ok": true, "delivered": delivered}))
}

async fn admin_conversations(Admin(app): Admin) -> ApiResult {
    ok_json(json!({"conversations": app.shared.conversations.list()}))
}

async fn admin_clear(Admin(app): Admin, body: Body) -> ApiResult {
    // An empty body clears everything.
    let bytes = axum::body::to_bytes(body, app.config.bridge.max_body_bytes)
        .await
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "body too large"))?;
    let key = if bytes.trim_ascii().is_empty() {
        None
    } else {
        let v: Value = serde_json::from_slice(&bytes).map_err(bad_json)?;
        optional_string(&v, "key")?
    };
    let cleared = app.shared.conversations.clear(key.as_deref());
    ok_json(json!({"ok": true, "cleared": cleared}))
}

async fn admin_tools(Admin(app): Admin) -> ApiResult {
    ok_json(json!({
        "tools": app.shared.mcp.tools(&Scope::All),
        "connections": app.shared.mcp.connections(),
    }))
}

async fn admin_call(Admin(app): Admin, headers: HeaderMap, body: Body) -> ApiResult {
    let v = json_body(&app, body, &headers).await?;
    let name =
        optional_string(&v, "name")?.ok_or_else(|| ApiError::bad_request("`name` is required"))?;
    let arguments = v.get("arguments").cloned().unwrap_or(Value::Null);
    let outcome = app
        .shared
        .mcp
        .call_tool(&Scope::All, &name, arguments, app.config.mcp.call_timeout())
        .await;
    match outcome {
        Ok(result) => ok_json(json!({"ok": !result.is_error, "result": result})),
        Err(crate::mcp_endpoint::hub::HubError::Refused(e)) => {
            Err(ApiError::bad_request(e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "tool_failed",
            e.to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::*;
    use crate::metrics::Metrics;
    use crate::providers::Providers;

    fn app(config: Config) -> (Arc<App>, watch::Sender<bool>) {
        let (stop, shutdown) = watch::channel(false);
        let app = App {
            shared: Shared::new(&config),
            admission: crate::admission::Admission::new(&config.limits, Arc::default()),
            config,
            providers: crate::providers::DoorProviderSet::uniform(Providers::embedded()),
            metrics: Arc::new(Metrics::new()),
            shutdown,
            sessions: Arc::default(),
            webrtc: None,
            vip_sessions: crate::vip::Sessions::default(),
            cluster: None,
        };
        (Arc::new(app), stop)
    }

    /// Runs the `/admin/*` extractor on a request from `peer` with `headers`.
    async fn admin(
        app: &Arc<App>,
        peer: SocketAddr,
        headers: &HeaderMap,
    ) -> Result<Admin, Response> {
        let mut request = Request::new(());
        *request.headers_mut() = headers.clone();
        request.extensions_mut().insert(ConnectInfo(peer));
        let (mut parts, ()) = request.into_parts();
        Admin::from_request_parts(&mut parts, app).await
    }

    #[tokio::test]
    async fn admin_refuses_remote_and_proxied_peers() {
        let (app, _stop) = app(Config::default());
        let remote: SocketAddr = "192.168.1.20:5555".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5555".parse().unwrap();
        let h = HeaderMap::new();
        // Every admin handler, `admin_sessions` and `admin_not_found` among them, takes `Admin`.
        let r = admin(&app, remote, &h).await.unwrap_err();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let ok = admin_sessions(admin(&app, local, &h).await.unwrap())
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let missing = admin_not_found(admin(&app, local, &h).await.unwrap()).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert!(admin_guard(&app, mapped, &h).is_ok());
        assert!(admin(&app, mapped, &h).await.is_ok());
        let mut proxied = HeaderMap::new();
        proxied.insert("x-forwarded-for", "10.0.0.9".parse().unwrap());
        let r = admin_guard(&app, local, &proxied).unwrap_err();
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        let r = admin(&app, local, &proxied).await.unwrap_err();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn admin_needs_the_token_too() {
        let mut config = Config::default();
        config.bridge.tokens = vec!["s3cret".into()];
        let (app, _stop) = app(config);
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let r = admin_guard(&app, local, &HeaderMap::new()).unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(admin_guard(&app, local, &h).is_ok());
    }

    #[tokio::test]
    async fn admin_tokens_take_precedence_over_bridge_tokens() {
        let mut config = Config::default();
        config.bridge.tokens = vec!["bridge-tok".into()];
        config.admin.tokens = vec!["adm-tok".into()];
        let (app, _stop) = app(config);
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let remote: SocketAddr = "192.168.1.20:1".parse().unwrap();
        let bearer = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
            h
        };
        let r = admin_guard(&app, local, &HeaderMap::new()).unwrap_err();
        assert_eq!(
            (r.status, r.code),
            (StatusCode::UNAUTHORIZED, "unauthorized")
        );
        let r = admin_guard(&app, local, &bearer("bridge-tok")).unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(admin_guard(&app, local, &bearer("adm-tok")).is_ok());
        assert!(admin_guard(&app, remote, &bearer("adm-tok")).is_ok());
        let r = admin(&app, remote, &bearer("adm")).await.unwrap_err();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn config_env_and_persona() {
        let mut c = BridgeConfig::default();
        let env = |k: &str| match k {
            "VOXGATE_BRIDGE_TOKENS" => Some("x,y".to_owned()),
            "VOXGATE_BRIDGE_EMOJI_CHANNELS" => Some("stackchan, robot".to_owned()),
            "VOXGATE_BRIDGE_TURN_TIMEOUT_SECS" => Some("9".to_owned()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert_eq!(c.tokens, ["x", "y"]);
        assert_eq!(c.emoji_channels, ["stackchan", "robot"]);
        assert_eq!(c.turn_timeout_secs, 9);
        c.check().unwrap();
        let p = c.persona("robot", 100);
        assert!(p.emoji.is_some());
        assert!(p.system_prompt.contains("😴"), "{}", p.system_prompt);
        assert!(c.persona("web", 100).emoji.is_none());
        c.mask_secrets();
        assert_eq!(c.tokens, ["***", "***"]);
        let bad = |k: &str| (k == "VOXGATE_BRIDGE_MAX_BODY_BYTES").then(|| "big".to_owned());
        assert!(BridgeConfig::default().apply_env(&bad).is_err());
        c.turn_timeout_secs = 0;
        assert!(c.check().is_err());
    }
}
