//! LLM, ASR and TTS back ends behind async traits: OpenAI-compatible APIs, ElevenLabs, a local command TTS, and offline embedded defaults.
