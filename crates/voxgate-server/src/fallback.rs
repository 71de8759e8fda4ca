//! Deadlines and fallbacks around any provider, so no back end needs its own: [`Deadline`]
//! bounds the wait for the first output (retries inside the provider included, since the
//! wrapper drops the provider's stream when time is up) and each silence after it;
//! [`Fallback`] hands a request to a second provider when the first fails before any output.
//!
//! Once output has begun a failure is the turn's, as before: replaying the request on another
//! provider would repeat what the client already heard.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::Instant;
use voxgate_providers::{
    Asr, Llm, LlmEvent, LlmRequest, LlmStream, ProcessHold, ProviderError, TimeoutPhase,
    Transcript, Tts, TtsRequest, TtsStream, Utterance,
};

use crate::metrics::{Metrics, ProviderKind};

/// Waits for `fut`, at most until `until` when given.
async fn within<F: Future>(until: Option<Instant>, fut: F) -> Option<F::Output> {
    match until {
        Some(t) => tokio::time::timeout_at(t, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// A provider with a deadline to its first output and a limit on each silence after it.
/// Expiry ends the request with [`ProviderError::Timeout`] (phase `FirstByte` before any
/// output, `Idle` after) and is counted in `voxgate_provider_timeouts_total`.
pub(crate) struct Deadline<P: ?Sized> {
    inner: Arc<P>,
    first: Option<Duration>,
    idle: Option<Duration>,
    metrics: Arc<Metrics>,
}

impl<P: ?Sized> Deadline<P> {
    pub(crate) fn new(
        inner: Arc<P>,
        first: Option<Duration>,
        idle: Option<Duration>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner,
            first,
            idle,
            metrics,
        }
    }
}

/// The limit on the next item: the absolute first-output deadline until something came,
/// then the idle limit from now.
fn next_limit(
    started: bool,
    first: Option<Instant>,
    idle: Option<Duration>,
) -> (Option<Instant>, TimeoutPhase, Option<Duration>) {
    if started {
        (idle.map(|d| Instant::now() + d), TimeoutPhase::Idle, idle)
    } else {
        (first, TimeoutPhase::FirstByte, None)
    }
}

impl<P: ?Sized> Deadline<P> {
    /// `inner` bounded by this deadline: items pass through until `first` passes without
    /// output or `idle` passes between two items after it; then `timeout` makes the last item
    /// and the provider's stream is dropped, which cancels its work (closes the connection,
    /// stops its retries). `is_output` tells output (which starts the idle limit) from the rest.
    fn bound<T: Send + 'static>(
        &self,
        inner: Pin<Box<dyn Stream<Item = T> + Send + 'static>>,
        kind: ProviderKind,
        is_output: fn(&T) -> bool,
        timeout: fn(ProviderError) -> T,
    ) -> Pin<Box<dyn Stream<Item = T> + Send + 'static>> {
        let first_limit = self.first;
        let state = (Some(inner), false, self.first.map(|d| Instant::now() + d));
        let idle = self.idle;
        let metrics = Arc::clone(&self.metrics);
        Box::pin(futures::stream::unfold(
            state,
            move |(inner, started, first)| {
                let metrics = Arc::clone(&metrics);
                async move {
                    let mut inner = inner?;
                    let (until, phase, idle_after) = next_limit(started, first, idle);
                    match within(until, inner.next()).await {
                        Some(Some(item)) => {
                            let started = started || is_output(&item);
                            Some((item, (Some(inner), started, first)))
                        }
                        Some(None) => None,
                        None => {
                            metrics.provider_timeout(kind);
                            let after = idle_after.or(first_limit).unwrap_or_default();
                            drop(inner);
                            Some((
                                timeout(ProviderError::Timeout { phase, after }),
                                (None, started, first),
                            ))
                        }
                    }
                }
            },
        ))
    }
}

impl Llm for Deadline<dyn Llm> {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        self.bound(
            self.inner.generate(request),
            ProviderKind::Llm,
            |e| matches!(e, LlmEvent::TextDelta(_) | LlmEvent::ToolCall(_)),
            LlmEvent::Error,
        )
    }

    fn for_conversation(&self) -> Option<Arc<dyn Llm>> {
        let inner = self.inner.for_conversation()?;
        Some(Arc::new(Self::new(
            inner,
            self.first,
            self.idle,
            Arc::clone(&self.metrics),
        )))
    }

    fn reserve_process(
        &self,
        hold: &mut dyn FnMut() -> Result<ProcessHold, ProviderError>,
    ) -> Result<(), ProviderError> {
        self.inner.reserve_process(hold)
    }
}

#[async_trait::async_trait]
impl Asr for Deadline<dyn Asr> {
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError> {
        let until = self.first.map(|d| Instant::now() + d);
        if let Some(r) = within(until, self.inner.transcribe(utterance)).await {
            return r;
        }
        self.metrics.provider_timeout(ProviderKind::Asr);
        Err(ProviderError::Timeout {
            phase: TimeoutPhase::Total,
            after: self.first.unwrap_or_default(),
        })
    }
}

impl Tts for Deadline<dyn Tts> {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        self.bound(
            self.inner.synthesize(request),
            ProviderKind::Tts,
            Result::is_ok,
            Err,
        )
    }
}

/// A primary provider and the one that takes over a request the primary fails (or times out)
/// before any output; counted in `voxgate_provider_fallbacks_total`.
pub(crate) struct Fallback<P: ?Sized> {
    primary: Arc<P>,
    fallback: Arc<P>,
    metrics: Arc<Metrics>,
}

impl<P: ?Sized> Fallback<P> {
    pub(crate) fn new(primary: Arc<P>, fallback: Arc<P>, metrics: Arc<Metrics>) -> Self {
        Self {
            primary,
            fallback,
            metrics,
        }
    }
}

/// Logs a switch; the error's text names the failure, never a key.
fn switching(kind: &str, e: &ProviderError) {
    tracing::warn!(error = %e, "{kind} failed before any output; trying the fallback");
}

impl Llm for Fallback<dyn Llm> {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        let primary = self.primary.generate(request.clone());
        let fallback = Some((Arc::clone(&self.fallback), request));
        let metrics = Arc::clone(&self.metrics);
        Box::pin(futures::stream::unfold(
            (primary, false, fallback),
            move |(mut current, mut started, mut fallback)| {
                let metrics = Arc::clone(&metrics);
                async move {
                    loop {
                        let event = current.next().await?;
                        match event {
                            LlmEvent::Error(e) if !started && fallback.is_some() => {
                                if let Some((llm, request)) = fallback.take() {
                                    switching("the language model", &e);
                                    metrics.provider_fallback(ProviderKind::Llm);
                                    current = llm.generate(request);
                                }
                            }
                            event => {
                                if matches!(event, LlmEvent::TextDelta(_) | LlmEvent::ToolCall(_)) {
                                    started = true;
                                }
                                return Some((event, (current, started, fallback)));
                            }
                        }
                    }
                }
            },
        ))
    }

    fn for_conversation(&self) -> Option<Arc<dyn Llm>> {
        let primary = self.primary.for_conversation();
        let fallback = self.fallback.for_conversation();
        if primary.is_none() && fallback.is_none() {
            return None;
        }
        Some(Arc::new(Self::new(
            primary.unwrap_or_else(|| Arc::clone(&self.primary)),
            fallback.unwrap_or_else(|| Arc::clone(&self.fallback)),
            Arc::clone(&self.metrics),
        )))
    }

    /// The primary's: the turn goes to it first (a fallback that runs processes too takes
    /// its place when it starts one, or fails the request then).
    fn reserve_process(
        &self,
        hold: &mut dyn FnMut() -> Result<ProcessHold, ProviderError>,
    ) -> Result<(), ProviderError> {
        self.primary.reserve_process(hold)
    }
}

#[async_trait::async_trait]
impl Asr for Fallback<dyn Asr> {
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError> {
        // A copy for the fallback: an utterance is at most some seconds of 16 kHz audio.
        match self.primary.transcribe(utterance.clone()).await {
            Err(e) => {
                switching("speech recognition", &e);
                self.metrics.provider_fallback(ProviderKind::Asr);
                self.fallback.transcribe(utterance).await
            }
            ok => ok,
        }
    }
}

impl Tts for Fallback<dyn Tts> {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        let primary = self.primary.synthesize(request.clone());
        let fallback = Some((Arc::clone(&self.fallback), request));
        let metrics = Arc::clone(&self.metrics);
        Box::pin(futures::stream::unfold(
            (primary, false, fallback),
            move |(mut current, mut started, mut fallback)| {
                let metrics = Arc::clone(&metrics);
                async move {
                    loop {
                        match current.next().await? {
                            Err(e) if !started && fallback.is_some() => {
                                if let Some((tts, request)) = fallback.take() {
                                    switching("speech synthesis", &e);
                                    metrics.provider_fallback(ProviderKind::Tts);
                                    current = tts.synthesize(request);
                                }
                            }
                            item => {
                                started |= item.is_ok();
                                return Some((item, (current, started, fallback)));
                            }
                        }
                    }
                }
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use voxgate_providers::{ChatMessage, DemoAgent, PcmChunk, ToneTts};

    use super::*;

    /// Never answers.
    struct Silent;

    impl Llm for Silent {
        fn generate(&self, _request: LlmRequest) -> LlmStream {
            Box::pin(futures::stream::pending())
        }
    }

    impl Tts for Silent {
        fn synthesize(&self, _request: TtsRequest) -> TtsStream {
            Box::pin(futures::stream::pending())
        }
    }

    #[async_trait::async_trait]
    impl Asr for Silent {
        async fn transcribe(&self, _u: Utterance) -> Result<Transcript, ProviderError> {
            std::future::pending().await
        }
    }

    /// One word, then silence.
    struct Stalls;

    impl Llm for Stalls {
        fn generate(&self, _request: LlmRequest) -> LlmStream {
            Box::pin(
                futures::stream::iter([LlmEvent::TextDelta("Hel".into())])
                    .chain(futures::stream::pending()),
            )
        }
    }

    impl Tts for Stalls {
        fn synthesize(&self, _request: TtsRequest) -> TtsStream {
            Box::pin(
                futures::stream::iter([Ok(PcmChunk {
                    sample_rate: 16_000,
                    samples: vec![0; 160],
                })])
                .chain(futures::stream::pending()),
            )
        }
    }

    fn request() -> LlmRequest {
        LlmRequest {
            messages: vec![ChatMessage::user("hi")],
            ..LlmRequest::default()
        }
    }

    const MS: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn llm_first_token_and_idle_deadlines() {
        let m = Arc::new(Metrics::new());
        let silent: Arc<dyn Llm> = Arc::new(Silent);
        let d = Deadline::new(silent, Some(MS), None, Arc::clone(&m));
        let events: Vec<_> = d.generate(request()).collect().await;
        assert!(matches!(
            events.as_slice(),
            [LlmEvent::Error(ProviderError::Timeout {
                phase: TimeoutPhase::FirstByte,
                ..
            })]
        ));
        let stalls: Arc<dyn Llm> = Arc::new(Stalls);
        let d = Deadline::new(stalls, Some(MS), Some(MS * 2), Arc::clone(&m));
        let events: Vec<_> = d.generate(request()).collect().await;
        assert!(matches!(
            events.as_slice(),
            [
                LlmEvent::TextDelta(_),
                LlmEvent::Error(ProviderError::Timeout {
                    phase: TimeoutPhase::Idle,
                    ..
                })
            ]
        ));
        assert_eq!(m.provider_timeouts(ProviderKind::Llm), 2);
        // A quick provider is untouched.
        let demo: Arc<dyn Llm> = Arc::new(DemoAgent::new());
        let d = Deadline::new(demo, Some(MS), Some(MS), Arc::clone(&m));
        let events: Vec<_> = d.generate(request()).collect().await;
        assert!(matches!(events.last(), Some(LlmEvent::Done { .. })));
    }

    #[tokio::test]
    async fn llm_fallback_only_before_output() {
        let m = Arc::new(Metrics::new());
        let silent: Arc<dyn Llm> = Arc::new(Silent);
        let primary: Arc<dyn Llm> = Arc::new(Deadline::new(silent, Some(MS), None, Arc::clone(&m)));
        let demo: Arc<dyn Llm> = Arc::new(DemoAgent::new());
        let f = Fallback::new(primary, demo, Arc::clone(&m));
        let events: Vec<_> = f.generate(request()).collect().await;
        assert!(
            matches!(events.first(), Some(LlmEvent::TextDelta(_))),
            "{events:?}"
        );
        assert!(matches!(events.last(), Some(LlmEvent::Done { .. })));
        assert_eq!(m.provider_fallbacks(ProviderKind::Llm), 1);
        // After output began, a failure is the turn's.
        let stalls: Arc<dyn Llm> = Arc::new(Stalls);
        let primary: Arc<dyn Llm> =
            Arc::new(Deadline::new(stalls, Some(MS), Some(MS), Arc::clone(&m)));
        let demo: Arc<dyn Llm> = Arc::new(DemoAgent::new());
        let f = Fallback::new(primary, demo, Arc::clone(&m));
        let events: Vec<_> = f.generate(request()).collect().await;
        assert!(
            matches!(events.last(), Some(LlmEvent::Error(_))),
            "{events:?}"
        );
        assert_eq!(m.provider_fallbacks(ProviderKind::Llm), 1);
    }

    #[tokio::test]
    async fn tts_and_asr_deadlines_and_fallbacks() {
        let m = Arc::new(Metrics::new());
        let silent: Arc<dyn Tts> = Arc::new(Silent);
        let primary: Arc<dyn Tts> = Arc::new(Deadline::new(silent, Some(MS), None, Arc::clone(&m)));
        let tone: Arc<dyn Tts> = Arc::new(ToneTts);
        let f = Fallback::new(primary, tone, Arc::clone(&m));
        let items: Vec<_> = f
            .synthesize(TtsRequest {
                text: "hello".into(),
                ..TtsRequest::default()
            })
            .collect()
            .await;
        assert!(!items.is_empty() && items.iter().all(Result::is_ok));
        assert_eq!(m.provider_fallbacks(ProviderKind::Tts), 1);
        assert_eq!(m.provider_timeouts(ProviderKind::Tts), 1);
        let stalls: Arc<dyn Tts> = Arc::new(Stalls);
        let d = Deadline::new(stalls, Some(MS), Some(MS), Arc::clone(&m));
        let items: Vec<_> = d.synthesize(TtsRequest::default()).collect().await;
        assert!(matches!(
            items.as_slice(),
            [
                Ok(_),
                Err(ProviderError::Timeout {
                    phase: TimeoutPhase::Idle,
                    ..
                })
            ]
        ));
        let silent: Arc<dyn Asr> = Arc::new(Silent);
        let primary: Arc<dyn Asr> = Arc::new(Deadline::new(silent, Some(MS), None, Arc::clone(&m)));
        let none: Arc<dyn Asr> = Arc::new(voxgate_providers::NoAsr);
        let f = Fallback::new(primary, none, Arc::clone(&m));
        assert!(f.transcribe(Utterance::default()).await.is_ok());
        assert_eq!(m.provider_timeouts(ProviderKind::Asr), 1);
        assert_eq!(m.provider_fallbacks(ProviderKind::Asr), 1);
    }
}
