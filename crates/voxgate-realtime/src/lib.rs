//! The realtime protobuf session protocol (Deepslate-compatible): prost types, framing, typed validation.
