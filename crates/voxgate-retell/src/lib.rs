//! Retell's custom-LLM WebSocket protocol: typed events both ways, a sans-IO response tracker and a Retell-side driver.
