//! One connection to the server, over either transport: send a message, receive a message,
//! close.

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use voxgate_realtime::{ClientBoundMessage, ServiceBoundMessage};

use crate::error::{ClientError, Loss};
use crate::generated::realtime_service_client::RealtimeServiceClient;
use crate::options::{ClientOptions, Transport};

/// Largest message the client accepts from the server (audio chunks are far smaller).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Requests the gRPC request stream holds before `send` waits for HTTP/2 flow control.
const GRPC_QUEUE: usize = 64;

/// An open connection.
pub(crate) enum Link {
    Ws(Box<WebSocketStream<MaybeTlsStream<TcpStream>>>),
    Grpc {
        requests: mpsc::Sender<ServiceBoundMessage>,
        responses: Box<tonic::Streaming<ClientBoundMessage>>,
    },
}

impl Link {
    /// Opens a connection (not yet initialized).
    pub(crate) async fn open(options: &ClientOptions) -> Result<Self, ClientError> {
        let open = async {
            match options.endpoint.transport() {
                Transport::WebSocket => open_ws(options).await,
                Transport::Grpc => open_grpc(options).await,
            }
        };
        tokio::time::timeout(options.connect_timeout, open)
            .await
            .map_err(|_| ClientError::Connect {
                url: options.endpoint.url().to_owned(),
                reason: format!("no connection within {:?}", options.connect_timeout),
            })?
    }

    /// Sends one message.
    pub(crate) async fn send(&mut self, message: &ServiceBoundMessage) -> Result<(), Loss> {
        match self {
            Self::Ws(ws) => ws
                .send(Message::Binary(message.to_frame()))
                .await
                .map_err(|e| Loss::failed(e.to_string())),
            Self::Grpc { requests, .. } => requests
                .send(message.clone())
                .await
                .map_err(|_| Loss::failed("the gRPC request stream closed")),
        }
    }

    /// The next message; `Err` once the connection is over (how it ended).
    pub(crate) async fn recv(&mut self) -> Result<ClientBoundMessage, Loss> {
        match self {
            Self::Ws(ws) => loop {
                match ws.next().await {
                    None => return Err(Loss::failed("the connection closed")),
                    Some(Err(e)) => return Err(Loss::failed(e.to_string())),
                    Some(Ok(Message::Binary(b))) => return decode(b),
                    Some(Ok(Message::Close(frame))) => return Err(ws_close(frame.as_ref())),
                    Some(Ok(Message::Text(_))) => {
                        return Err(Loss::protocol("the server sent a text frame"));
                    }
                    Some(Ok(_)) => {}
                }
            },
            Self::Grpc { responses, .. } => match responses.message().await {
                Ok(Some(m)) => Ok(m),
                Ok(None) => Err(Loss::ended()),
                Err(status) => Err(grpc_status(&status)),
            },
        }
    }

    /// Ends the connection politely: a WebSocket close (1000), or the end of the request stream.
    pub(crate) async fn close(self) {
        match self {
            Self::Ws(mut ws) => {
                let _ = ws
                    .send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "client closed".into(),
                    })))
                    .await;
                // Reads the server's answer to the close so the socket closes cleanly.
                let drain = async { while let Some(Ok(_)) = ws.next().await {} };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), drain).await;
            }
            Self::Grpc {
                requests,
                mut responses,
            } => {
                drop(requests);
                let drain = async { while let Ok(Some(_)) = responses.message().await {} };
                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), drain).await;
            }
        }
    }
}

fn decode(frame: Bytes) -> Result<ClientBoundMessage, Loss> {
    ClientBoundMessage::decode_frame(frame)
        .map_err(|e| Loss::protocol(format!("undecodable server message: {e}")))
}

/// How a WebSocket close frame ends the session: 1001 and 1011 are worth a reconnection
/// (the server is going away or failed), other codes are final.
fn ws_close(frame: Option<&CloseFrame>) -> Loss {
    let (code, reason) = frame.map_or((1005, String::new()), |f| {
        (u16::from(f.code), f.reason.to_string())
    });
    let reason = if reason.is_empty() {
        format!("closed by the server ({code})")
    } else {
        format!("closed by the server ({code}): {reason}")
    };
    match code {
        1000 => Loss::Ended(reason),
        1001 | 1006 | 1011 | 1012 | 1013 => Loss::failed(reason),
        _ => Loss::Refused(reason),
    }
}

/// How a gRPC status ends the session: `UNAVAILABLE`, `INTERNAL`, `UNKNOWN` and `CANCELLED`
/// are worth a reconnection, other codes are final.
fn grpc_status(status: &tonic::Status) -> Loss {
    let reason = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        tonic::Code::Ok => Loss::Ended(reason),
        tonic::Code::Unavailable
        | tonic::Code::Internal
        | tonic::Code::Unknown
        | tonic::Code::Cancelled => Loss::failed(reason),
        _ => Loss::Refused(reason),
    }
}

async fn open_ws(options: &ClientOptions) -> Result<Link, ClientError> {
    let url = options.endpoint.url();
    let connect_error = |reason: String| ClientError::Connect {
        url: url.to_owned(),
        reason,
    };
    let mut request = url
        .into_client_request()
        .map_err(|e| connect_error(e.to_string()))?;
    if let Some(key) = &options.api_key {
        let value = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| connect_error("the API key is not a valid header value".into()))?;
        request.headers_mut().insert("authorization", value);
    }
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    match tokio_tungstenite::connect_async_with_config(request, Some(config), true).await {
        Ok((ws, _)) => Ok(Link::Ws(Box::new(ws))),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status();
            let body = response
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                .unwrap_or_default();
            let reason = format!("HTTP {status}: {body}");
            Err(match status.as_u16() {
                401 | 403 => ClientError::Unauthorized(reason),
                429 | 503 => ClientError::Refused(reason),
                _ => connect_error(reason),
            })
        }
        Err(e) => Err(connect_error(e.to_string())),
    }
}

async fn open_grpc(options: &ClientOptions) -> Result<Link, ClientError> {
    let url = options.endpoint.url();
    let connect_error = |reason: String| ClientError::Connect {
        url: url.to_owned(),
        reason,
    };
    if !url.starts_with("http://") {
        // TLS for gRPC would need a second rustls set-up beside the WebSocket one; until then
        // say so instead of failing obscurely.
        return Err(connect_error(
            "gRPC needs an http:// URL (plaintext HTTP/2); for TLS use the WebSocket \
             transport (wss://) or a local TLS-terminating proxy"
                .into(),
        ));
    }
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| connect_error(e.to_string()))?
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| connect_error(error_chain(&e)))?;
    let mut client = RealtimeServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let (requests, rx) = mpsc::channel(GRPC_QUEUE);
    let mut request = tonic::Request::new(tokio_stream_of(rx));
    if let Some(key) = &options.api_key {
        let value = format!("Bearer {key}")
            .parse()
            .map_err(|_| connect_error("the API key is not a valid metadata value".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    match client.session(request).await {
        Ok(response) => Ok(Link::Grpc {
            requests,
            responses: Box::new(response.into_inner()),
        }),
        Err(status) => {
            let reason = format!("{:?}: {}", status.code(), status.message());
            Err(match status.code() {
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                    ClientError::Unauthorized(reason)
                }
                tonic::Code::ResourceExhausted | tonic::Code::Unavailable => {
                    ClientError::Refused(reason)
                }
                _ => connect_error(reason),
            })
        }
    }
}

/// A request stream fed by a channel.
fn tokio_stream_of(
    rx: mpsc::Receiver<ServiceBoundMessage>,
) -> impl futures::Stream<Item = ServiceBoundMessage> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}

/// An error and its sources on one line (tonic's transport errors hide the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
