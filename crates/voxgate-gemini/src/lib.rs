//! The Gemini bridge JSON protocol and the upstream Gemini Live API messages, tolerant of real clients.
