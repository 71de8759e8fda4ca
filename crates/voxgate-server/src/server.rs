//! The runtime: one listener, the HTTP routes and every door, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connection::ConnectionLimits;

use crate::config::Config;
use crate::metrics::{Door, Metrics};
use crate::providers::Providers;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr} for {listener}: {source} (to move or disable it: {setting})")]
    Bind {
        /// Which listener: `main`, or a door's own (`gemini`, `xiaozhi`, `xiaozhi-ota`).
        listener: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The setting that moves or disables this listener.
        setting: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A configured provider cannot work.
    #[error("provider configuration: {0}")]
    Provider(#[from] voxgate_providers::ProviderError),
    /// The listener failed while serving (kept for compatibility: accept failures are now
    /// logged and retried).
    #[error("serving failed: {0}")]
    Serve(#[from] std::io::Error),
    /// `[cluster]` cannot work (a Redis URL that does not parse).
    #[error("cluster: {0}")]
    Cluster(String),
}

/// What every route and door shares: the configuration, providers, metrics and the shutdown
/// signal sessions watch.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) config: Config,
    /// The providers of each door (`[llm]`... with per-door overrides, deadlines, fallbacks).
    pub(crate) providers: crate::providers::DoorProviderSet,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// State doors share across sessions: the perception event bus, the MCP tool hub and the
    /// Bridge HTTP API's conversations ([`crate::bridge::Shared`]).
    pub(crate) shared: crate::bridge::Shared,
    /// Open WebSocket sessions of every door; shutdown waits for them.
    pub(crate) sessions: Arc<crate::door::Sessions>,
    /// Admission control every door's upgrade handler asks before the handshake.
    pub(crate) admission: crate::admission::Admission,
    /// The WebRTC media endpoint (`[webrtc]`), when enabled.
    pub(crate) webrtc: Option<Arc<crate::webrtc::Endpoint>>,
    /// Open VIP sessions, for `DELETE /webrtc/sessions/<id>`.
    pub(crate) vip_sessions: crate::vip::Sessions,
    /// This instance's link to the other instances (`[cluster]`), when configured.
    pub(crate) cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl App {
    /// An app over `config` with the embedded providers and fresh metrics (unit tests).
    #[cfg(test)]
    pub(crate) fn for_test(config: Config, shutdown: watch::Receiver<bool>) -> Self {
        let metrics = Arc::new(Metrics::new());
        Self {
            shared: crate::bridge::Shared::new(&config),
            admission: crate::admission::Admission::new(&config.limits, Arc::clone(&metrics)),
            config,
            providers: crate::providers::DoorProviderSet::uniform(Providers::embedded()),
            metrics,
            shutdown,
            sessions: Arc::default(),
            webrtc: None,
            vip_sessions: crate::vip::Sessions::default(),
            cluster: None,
        }
    }

    /// What the door driver needs for one session of `door`, with the server's lifecycle
    /// limits (a door adjusts them for its own overrides).
    pub(crate) fn driver(&self, door: Door) -> crate::door::DriverContext {
        crate::door::DriverContext {
            door,
            metrics: Arc::clone(&self.metrics),
            providers: self.providers.for_door(door).clone(),
            limits: crate::door::SessionLimits::from_config(&self.config.limits),
            max_frame_bytes: self.config.max_frame_bytes,
            shutdown: self.shutdown.clone(),
            sessions: Arc::clone(&self.sessions),
            mcp: None,
            webrtc: self.webrtc.clone(),
            identity: crate::door::observe::Identity::default(),
        }
    }

    /// Admits a new session of `door` from `peer`: this instance's limits
    /// ([`crate::admission`]), then the cluster-wide one when `[cluster] max_sessions` is set.
    /// Keep the result for the session's whole life.
    ///
    /// # Errors
    /// A [`Refusal`](crate::admission::Refusal) (already counted) to answer the request with.
    pub(crate) async fn admit(
        &self,
        door: Door,
        peer: std::net::IpAddr,
    ) -> Result<crate::admission::Admitted, crate::admission::Refusal> {
        let permit = self.admission.try_admit(door, peer)?;
        let slot = match &self.cluster {
            None => None,
            Some(c) => c
                .admit()
                .await
                .map_err(|()| self.admission.refuse_cluster(door))?,
        };
        Ok(crate::admission::Admitted {
            _permit: permit,
            _slot: slot,
        })
    }

    /// The MCP endpoint's tools for a session of a door whose `mcp_tools` is `on`: every
    /// connection's tools (doors have no per-token scope; the endpoint's `[mcp] tokens` decide
    /// who may connect), each call bounded by `[mcp] call_timeout_secs`.
    pub(crate) fn mcp_tools(&self, on: bool) -> Option<crate::providers::McpTools> {
        on.then(|| crate::providers::McpTools {
            hub: Arc::clone(&self.shared.mcp),
            scope: crate::mcp_endpoint::hub::Scope::All,
            timeout: self.config.mcp.call_timeout(),
        })
    }
}

/// An extra listener a door asks for (for example the Xiaozhi door's own port that accepts any
/// path): its name for logs and [`Server::listener_addr`], the address, and the routes it serves.
pub(crate) struct DoorListener {
    pub(crate) name: &'static str,
    pub(crate) addr: SocketAddr,
    pub(crate) routes: Router<Arc<App>>,
}

/// A bound server, ready to [`run`](Server::run).
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    extra: Vec<BoundListener>,
    app: Arc<App>,
    stop: watch::Sender<bool>,
}

#[derive(Debug)]
struct BoundListener {
    name: &'static str,
    addr: SocketAddr,
    listener: TcpListener,
    routes: Router<Arc<App>>,
}

async fn bind_addr(
    listener: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), ServerError> {
    let error = |source| ServerError::Bind {
        listener,
        addr,
        setting: listen_setting(listener),
        source,
    };
    let socket = TcpListener::bind(addr).await.map_err(error)?;
    let bound = socket.local_addr().map_err(error)?;
    Ok((socket, bound))
}

/// Where the address of `listener` is configured, for an error that says how to fix a clash
/// (a second instance on the same machine meets the doors' fixed ports first).
fn listen_setting(listener: &str) -> &'static str {
    match listener {
        "gemini" => {
            "[gemini] listen / VOXGATE_GEMINI_LISTEN (VOXGATE_GEMINI_LISTEN=off closes the \
             Gemini door's own listener)"
        }
        "xiaozhi" => "[xiaozhi] listen / VOXGATE_XIAOZHI_LISTEN (empty: off)",
        "xiaozhi-ota" => "[xiaozhi] ota_listen / VOXGATE_XIAOZHI_OTA_LISTEN (empty: off)",
        "realtime-grpc" => {
            "[realtime] grpc_listen / VOXGATE_REALTIME_GRPC_LISTEN (empty: on the main listener)"
        }
        "webrtc" => {
            "[webrtc] udp_listen / VOXGATE_WEBRTC_UDP_LISTEN ([webrtc] enabled = false turns \
             WebRTC off)"
        }
        _ => "listen / VOXGATE_LISTEN / --listen",
    }
}

impl Server {
    /// Binds `config.listen` with the providers the configuration names.
    ///
    /// # Errors
    /// [`ServerError::Bind`] or [`ServerError::Provider`].
    pub async fn bind(mut config: Config) -> Result<Self, ServerError> {
        let providers = Providers::from_config(&config)?;
        // The recognizers are the configuration's: speculation stays off where there is none.
        config.mark_recognizers();
        Self::bind_with(config, providers).await
    }

    /// Binds `config.listen` with the given providers (tests, embedders) as the server's;
    /// the deadlines and fallbacks of `[llm]`, `[asr]` and `[tts]` and the per-door sections
    /// (`[xiaozhi.tts]`...) still apply.
    ///
    /// # Errors
    /// [`ServerError::Bind`], or [`ServerError::Provider`] for a door section or fallback
    /// that cannot be built.
    pub async fn bind_with(config: Config, providers: Providers) -> Result<Self, ServerError> {
        let (listener, addr) = bind_addr("main", config.listen).await?;
        let mut extra = Vec::new();
        for door in door_listeners(&config) {
            let (listener, addr) = bind_addr(door.name, door.addr).await?;
            extra.push(BoundListener {
                name: door.name,
                addr,
                listener,
                routes: door.routes,
            });
        }
        let (stop, shutdown) = watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        let providers = crate::providers::DoorProviderSet::new(&config, providers, &metrics)?;
        let admission = crate::admission::Admission::new(&config.limits, Arc::clone(&metrics));
        let cluster = crate::cluster::Cluster::new(&config.cluster, Arc::clone(&metrics))
            .map_err(ServerError::Cluster)?;
        if let Some(c) = &cluster {
            c.first_heartbeat().await;
        }
        let webrtc = if config.webrtc.enabled {
            let endpoint = crate::webrtc::Endpoint::bind(&config.webrtc, Arc::clone(&metrics))
                .await
                .map_err(|source| ServerError::Bind {
                    listener: "webrtc",
                    addr: config.webrtc.udp_listen,
                    setting: listen_setting("webrtc"),
                    source,
                })?;
            Some(endpoint)
        } else {
            None
        };
        Ok(Self {
            listener,
            addr,
            extra,
            app: Arc::new(App {
                shared: crate::bridge::Shared::new(&config),
                config,
                providers,
                metrics,
                shutdown,
                sessions: Arc::default(),
                admission,
                webrtc,
                vip_sessions: crate::vip::Sessions::default(),
                cluster,
            }),
            stop,
        })
    }

    /// The bound address (the real port when the configuration asked for port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of a door's own listener by name (`"xiaozhi"`, `"xiaozhi-ota"`,
    /// `"gemini"`), when the configuration enables it.
    #[must_use]
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.extra.iter().find(|l| l.name == name).map(|l| l.addr)
    }

    /// The WebRTC endpoint's bound UDP address, when WebRTC is enabled.
    #[must_use]
    pub fn webrtc_addr(&self) -> Option<SocketAddr> {
        self.app.webrtc.as_ref().map(|e| e.local_addr())
    }

    /// What a start-up log shows: one line per door with where it listens, then one naming
    /// the active language model, speech recognizer and synthesizer.
    #[must_use]
    pub fn startup_lines(&self) -> Vec<String> {
        let c = &self.app.config;
        let main = self.addr;
        let own = |name| {
            self.listener_addr(name)
                .map(|a| format!(" and {a} (any path)"))
        };
        let mut lines = vec![
            format!(
                "realtime door: ws://{main}/realtime, gRPC {}",
                self.listener_addr("realtime-grpc").map_or_else(
                    || format!("http://{main} (h2c)"),
                    |a| format!("http://{a} (h2c, own listener)")
                )
            ),
            format!(
                "xiaozhi door: ws://{main}/xiaozhi/v1/{}, OTA http://{main}/xiaozhi/ota/{}",
                own("xiaozhi").unwrap_or_default(),
                own("xiaozhi-ota").unwrap_or_default(),
            ),
        ];
        if c.retell.enabled {
            lines.push(format!(
                "retell door: ws://{main}/llm-websocket/{{call_id}}, control API http://{main}/retell/calls"
            ));
        }
        if c.gemini.enabled {
            lines.push(format!(
                "gemini door ({} mode): ws://{main}/gemini{}",
                format!("{:?}", c.gemini.mode).to_lowercase(),
                own("gemini").unwrap_or_default()
            ));
        }
        lines.push(format!(
            "bridge API: http://{main}/api/message, MCP endpoint ws://{main}/mcp, admin \
             http://{main}/admin/, health and metrics http://{main}/health, /metrics"
        ));
        // The configuration was checked when loaded; a plan that does not resolve here only
        // comes from a hand-built Config, and says so.
        let llm = c
            .llm_plan()
            .map_or_else(|e| e.to_string(), |p| p.describe());
        let asr = c
            .asr_plan()
            .map_or_else(|e| e.to_string(), |p| p.describe());
        let tts = c
            .tts_plan()
            .map_or_else(|e| e.to_string(), |p| p.describe());
        lines.push(format!("providers: LLM {llm}; ASR {asr}; TTS {tts}"));
        for door in c.door_providers.describe() {
            lines.push(format!("providers of the {door}"));
        }
        lines
    }

    /// The server's metrics registry.
    #[must_use]
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.app.metrics)
    }

    /// Serves until `shutdown` completes, then closes every session and returns once the
    /// connections are gone: HTTP connections get `[limits] shutdown_grace_secs` (and a
    /// second) to finish their requests, then are dropped, so a client holding an unfinished
    /// request cannot keep the server from exiting.
    ///
    /// # Errors
    /// None today ([`ServerError::Serve`] is kept for compatibility: accept failures are
    /// logged and retried).
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let router = router(Arc::clone(&self.app));
        let app = Arc::clone(&self.app);
        let limits = ConnectionLimits::from_config(&app.config.limits);
        let stop = self.stop;
        // The overload guard measures the runtime while the server runs.
        let guard = tokio::spawn(self.app.admission.clone().monitor(stop.subscribe()));
        let cluster = self.app.cluster.clone().map(|c| {
            tracing::info!(instance = c.instance(), "cluster instance");
            let handlers: crate::cluster::Handlers =
                Arc::new(crate::cluster::Routed(Arc::clone(&self.app)));
            // Its own stop, sent once sessions are gone: draining sessions stay reachable and
            // keep their directory entries until they end.
            let (done, until) = watch::channel(false);
            let bus = Arc::clone(&self.app.shared.perception);
            let hub = Arc::clone(&self.app.shared.mcp);
            (done, tokio::spawn(c.run(handlers, bus, hub, until)))
        });
        let mut extra = tokio::task::JoinSet::new();
        for l in self.extra {
            tracing::info!(addr = %l.addr, listener = l.name, "door listener");
            // The realtime gRPC listener's request bodies are whole sessions, bounded by the
            // door's own timeouts.
            let routes = if l.name == "realtime-grpc" {
                l.routes
            } else {
                with_http_bounds(l.routes, &app.config.limits)
            };
            extra.spawn(crate::connection::serve(
                l.listener,
                routes.with_state(Arc::clone(&self.app)),
                app.admission.clone(),
                limits,
                stop.subscribe(),
            ));
        }
        tracing::info!(addr = %self.addr, "voxgate server listening");
        let main = crate::connection::serve(
            self.listener,
            router,
            app.admission.clone(),
            limits,
            stop.subscribe(),
        );
        let signal = tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down");
            // Sessions and connections watch this: sessions drain and close, HTTP requests in
            // flight get the grace to finish, every listener stops accepting.
            let _ = stop.send(true);
            stop
        });
        main.await;
        // The main listener only returns after `stop` was sent.
        let stop = signal.await.ok();
        // Sessions drain (a reply may finish) for the grace period, then close with 1001;
        // give their close handshakes a moment on top.
        let driver = app.driver(Door::Realtime).limits;
        let wait = driver.shutdown_grace
            + driver
                .write_timeout
                .unwrap_or(std::time::Duration::from_secs(10));
        if tokio::time::timeout(wait, app.sessions.wait_closed())
            .await
            .is_err()
        {
            tracing::warn!(
                open = app.sessions.open(),
                "sessions still open after the grace period"
            );
        }
        // They have seen `stop` too, and drop their connections within the same bound.
        while let Some(r) = extra.join_next().await {
            if let Err(e) = r {
                tracing::warn!(error = %e, "door listener failed");
            }
        }
        // It has seen `stop` by now; abort in case it is between samples.
        guard.abort();
        drop(stop);
        if let Some((done, task)) = cluster {
            let _ = done.send(true);
            // Giving back leases is one round trip; a dead Redis must not hold the exit up.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(3), task).await;
        }
        Ok(())
    }
}

/// What [`raise_open_file_limit`] did: the process's open-file limit before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now (the hard limit when raising worked).
    pub after: u64,
}

/// Raises this process's open-file limit (`RLIMIT_NOFILE`) from its soft limit (often 1,024)
/// to its hard limit, so the connections and sessions `[limits]` admit get descriptors
/// rather than `accept` failing at a thousand. The binary calls it at start and logs the
/// result; embedders decide for themselves.
///
/// # Errors
/// The OS refused (for example a hard limit the kernel will not grant as a soft one), or not
/// a Unix system.
pub fn raise_open_file_limit() -> std::io::Result<OpenFileLimit> {
    #[cfg(unix)]
    {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        if soft < hard {
            setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        }
        let (after, _) = getrlimit(Resource::RLIMIT_NOFILE)?;
        Ok(OpenFileLimit {
            before: soft,
            after,
        })
    }
    #[cfg(not(unix))]
    {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "the open-file limit is raised on Unix only",
        ))
    }
}

/// Completes on Ctrl-C (and SIGTERM on Unix): the usual `shutdown` for [`Server::run`].
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// The extra listeners the configuration enables, door by door.
fn door_listeners(config: &Config) -> Vec<DoorListener> {
    let mut all = crate::xiaozhi::listeners(config);
    all.extend(crate::gemini::listeners(config));
    all.extend(crate::realtime::grpc::listeners(config));
    all
}

fn router(app: Arc<App>) -> Router {
    // Each door module contributes its own routes on the main listener.
    let http = Router::new()
        .merge(crate::xiaozhi::routes())
        .merge(crate::retell::routes())
        .merge(crate::gemini::routes())
        .merge(crate::bridge::routes())
        .merge(crate::mcp_endpoint::routes())
        .merge(crate::vip::routes())
        .route("/health", get(health))
        .route("/metrics", get(metrics));
    // The realtime door's routes after the bounds: its gRPC request body is a whole session
    // (the door's own timeouts bound it), its WebSocket upgrades have no body.
    with_http_bounds(http, &app.config.limits)
        .merge(crate::realtime::routes(&app.config))
        .with_state(app)
}

/// `routes` with the bounds every plain HTTP request runs under: its body complete within
/// `[limits] body_timeout_secs`.
fn with_http_bounds(
    routes: Router<Arc<App>>,
    limits: &crate::config::LimitsConfig,
) -> Router<Arc<App>> {
    match limits.body_timeout() {
        Some(timeout) => routes.layer(axum::middleware::from_fn_with_state(
            timeout,
            crate::connection::body_deadline,
        )),
        None => routes,
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let body = serde_json::json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "sessions": Door::ALL
            .iter()
            .map(|d| (d.label().to_owned(), app.metrics.active_sessions(*d).into()))
            .collect::<serde_json::Map<String, serde_json::Value>>(),
        "webrtc_connections": app.webrtc.as_ref().map_or(0, |w| w.open()),
        // Redis down is not unhealthy: the instance serves its own sessions (docs/scale-out.md).
        "cluster": app.cluster.as_ref().map(|c| serde_json::json!({
            "instance": c.instance(),
            "redis": if c.is_up() { "up" } else { "down" },
        })),
        // The in-process speech models' worker pools: how close they are to refusing turns.
        "local_speech": crate::local_speech::health(),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        app.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        use nix::sys::resource::{Resource, getrlimit};
        let limit = super::raise_open_file_limit().unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(limit.after, soft);
        assert_eq!(soft, hard);
        assert!(limit.after >= limit.before);
        // Again: nothing left to raise.
        let again = super::raise_open_file_limit().unwrap();
        assert_eq!((again.before, again.after), (hard, hard));
    }
}
