//! The server's own share of a turn's latency: from the moment the turn's end is decided to
//! the moment its first reply audio frame is written to the socket, minus the time spent
//! waiting for providers.
//!
//! The chain of a spoken turn is: decision → LLM request → (provider) → the text that
//! completes a sentence → TTS request → (provider) → the first audio → encode → write. The
//! provider hops are the waits from asking a provider to the arrival (in the provider task,
//! before any queueing in the session) of the answer that moved the turn on; everything else
//! is the server's: the session loop's scheduling, the engine, queueing of events, the
//! encoder, the writer. With speculative results adopted at the decision nothing is asked
//! after it, and the whole interval is the server's.
//!
//! The timer only observes what a translator step asks of the driver ([`Step`]), so it is
//! the same for every door; a door marks the decision ([`super::Out::turn_decided`]) and its
//! reply audio is the droppable frames, or the audio it plays on a WebRTC track (timed when
//! handed to the track's sender).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use voxgate_engine::{ProviderRequest, RequestId};

/// Most provider requests of one turn remembered; a reply with more sentences than this
/// before its first audio frame stops being timed rather than growing the map.
const MAX_ASKED: usize = 64;

/// What woke the session for one step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trigger {
    /// When it happened: a provider event's arrival in its task, a timer's deadline, or now.
    pub(crate) at: Instant,
    /// The provider request whose event it was.
    pub(crate) answer_to: Option<RequestId>,
}

/// What one step asked for, as the timer needs it.
#[derive(Debug)]
pub(crate) struct Step<'a> {
    /// The door marked the end of a user turn in this step.
    pub(crate) decided: bool,
    /// Provider requests started (or cancelled) in this step.
    pub(crate) requests: &'a [ProviderRequest],
    /// Reply audio frames queued (or played on a WebRTC track) in this step.
    pub(crate) audio_frames: usize,
}

/// A first reply audio frame to time once written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FirstAudio {
    /// When the turn's end was decided.
    pub(crate) decided: Instant,
    /// Time spent waiting for providers since.
    pub(crate) provider: Duration,
}

impl FirstAudio {
    /// The server's share, given when the frame was written.
    pub(crate) fn server_added(&self, written: Instant) -> Duration {
        written
            .saturating_duration_since(self.decided)
            .saturating_sub(self.provider)
    }
}

/// Tracks the turn in flight between its decision and its first reply audio frame.
#[derive(Debug, Default)]
pub(crate) struct TurnTimer {
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    decided: Instant,
    provider: Duration,
    /// Requests asked since the decision, and when.
    asked: HashMap<RequestId, Instant>,
}

impl TurnTimer {
    /// Accounts for one step taken at `now`; returns the timing to attach to the first audio
    /// frame of this step when it is the turn's first.
    pub(crate) fn step(
        &mut self,
        trigger: Trigger,
        now: Instant,
        step: &Step<'_>,
    ) -> Option<FirstAudio> {
        if step.decided {
            self.pending = Some(Pending {
                decided: trigger.at.min(now),
                provider: Duration::ZERO,
                asked: HashMap::new(),
            });
        }
        let p = self.pending.as_mut()?;
        let moves_on = step.audio_frames > 0
            || step.requests.iter().any(|r| {
                matches!(
                    r,
                    ProviderRequest::Synthesize { .. } | ProviderRequest::Generate { .. }
                )
            });
        if moves_on && let Some(asked) = trigger.answer_to.and_then(|id| p.asked.remove(&id)) {
            p.provider += trigger.at.saturating_duration_since(asked);
        }
        for r in step.requests {
            match r {
                ProviderRequest::Cancel { id } => {
                    p.asked.remove(id);
                }
                ProviderRequest::Generate { id, .. }
                | ProviderRequest::Synthesize { id, .. }
                | ProviderRequest::CallTool { id, .. }
                | ProviderRequest::Transcribe { id, .. } => {
                    if p.asked.len() < MAX_ASKED {
                        p.asked.insert(*id, now);
                    } else {
                        self.pending = None;
                        return None;
                    }
                }
                _ => {}
            }
        }
        if step.audio_frames == 0 {
            return None;
        }
        let p = self.pending.take()?;
        Some(FirstAudio {
            decided: p.decided,
            provider: p.provider,
        })
    }
}

#[cfg(test)]
mod tests {
    use voxgate_engine::TurnId;

    use super::*;

    fn generate(id: u64) -> ProviderRequest {
        ProviderRequest::Generate {
            id: RequestId(id),
            turn: TurnId(1),
            messages: Vec::new(),
            tools: Vec::new(),
            temperature: None,
        }
    }

    fn synthesize(id: u64) -> ProviderRequest {
        ProviderRequest::Synthesize {
            id: RequestId(id),
            turn: TurnId(1),
            text: "Hi.".into(),
        }
    }

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    fn step(decided: bool, requests: &[ProviderRequest], audio_frames: usize) -> Step<'_> {
        Step {
            decided,
            requests,
            audio_frames,
        }
    }

    #[test]
    fn provider_waits_on_the_path_are_not_the_servers() {
        let t0 = Instant::now();
        let mut t = TurnTimer::default();
        let quiet = |at| Trigger {
            at,
            answer_to: None,
        };
        let answer = |at, id| Trigger {
            at,
            answer_to: Some(RequestId(id)),
        };
        // Decided by the endpoint timer due at 0, run 2 ms late: the LLM is asked at 2.
        assert_eq!(
            t.step(quiet(t0), ms(t0, 2), &step(true, &[generate(1)], 0)),
            None
        );
        // A first token at 400 that completes no sentence moves nothing on.
        assert_eq!(
            t.step(answer(ms(t0, 400), 1), ms(t0, 401), &step(false, &[], 0)),
            None
        );
        // The sentence's end arrives at 450, handled at 453, which asks the TTS.
        assert_eq!(
            t.step(
                answer(ms(t0, 450), 1),
                ms(t0, 453),
                &step(false, &[synthesize(2)], 0)
            ),
            None
        );
        // Audio arrives at 653, handled at 655, which queues the first frame.
        let first = t
            .step(answer(ms(t0, 653), 2), ms(t0, 655), &step(false, &[], 1))
            .unwrap();
        assert_eq!(first.decided, t0);
        assert_eq!(first.provider, Duration::from_millis(448 + 200));
        // Written at 656: 2 + 3 + 3 ms were the server's.
        assert_eq!(first.server_added(ms(t0, 656)), Duration::from_millis(8));
        // Later frames of the same reply are not timed.
        assert_eq!(
            t.step(answer(ms(t0, 700), 2), ms(t0, 700), &step(false, &[], 1)),
            None
        );
    }

    #[test]
    fn an_answer_ready_at_the_decision_is_all_server_time() {
        let t0 = Instant::now();
        let mut t = TurnTimer::default();
        let trigger = Trigger {
            at: t0,
            answer_to: Some(RequestId(9)),
        };
        let first = t.step(trigger, ms(t0, 1), &step(true, &[], 3)).unwrap();
        assert_eq!(first.provider, Duration::ZERO);
        assert_eq!(first.server_added(ms(t0, 4)), Duration::from_millis(4));
    }

    #[test]
    fn audio_before_any_decision_and_cancelled_requests_are_ignored() {
        let t0 = Instant::now();
        let mut t = TurnTimer::default();
        let quiet = Trigger {
            at: t0,
            answer_to: None,
        };
        assert_eq!(t.step(quiet, t0, &step(false, &[], 2)), None);
        t.step(quiet, t0, &step(true, &[generate(1)], 0));
        t.step(
            quiet,
            t0,
            &step(false, &[ProviderRequest::Cancel { id: RequestId(1) }], 0),
        );
        // The cancelled request's late event does not count as a provider wait.
        let late = Trigger {
            at: ms(t0, 50),
            answer_to: Some(RequestId(1)),
        };
        let first = t.step(late, ms(t0, 50), &step(false, &[], 1)).unwrap();
        assert_eq!(first.provider, Duration::ZERO);
    }
}
