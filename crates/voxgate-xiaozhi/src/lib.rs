//! The Xiaozhi ESP32 device protocol: binary audio framing v1/v2/v3, JSON control messages, OTA, emotion channel, MCP envelope.
