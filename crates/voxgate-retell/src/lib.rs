//! Retell's custom-LLM WebSocket protocol: typed events both ways, a sans-IO response tracker
//! and a Retell-side driver.

mod call;
mod de;
mod error;
mod retell_event;
mod server_event;
mod transcript;

pub use call::{Call, CallType};
pub use error::{Blame, DecodeError, EncodeError};
pub use retell_event::{
    CallDetails, INTERACTION_TYPE, PingPong, ResponseRequest, RetellEvent, UnknownEvent, UpdateOnly,
};
pub use server_event::{
    AgentConfig, AgentInterrupt, ConfigBody, Metadata, RESPONSE_TYPE, Response, ServerEvent,
    ToolCallInvocation, ToolCallResult,
};
pub use transcript::{Role, TranscriptItem, TurnTaking, Utterance, Word};

mod tracker;
pub use tracker::{
    BeginMessage, Generate, KEEPALIVE_INTERVAL, PING_INTERVAL, REMINDER_PROMPT, RequestKind,
    ResponseTracker, SILENCE_TIMEOUT, TrackerConfig, TrackerError, TrackerInput, TrackerOutput,
    TrackerStats,
};

mod driver;
pub use driver::{DriverConfig, DriverInput, DriverOutput, EndReason, RetellDriver, Violation};
