//! Sans-IO JSON-RPC 2.0 and MCP client/server machines, a tool registry with JSON Schema validation, and the action registry.
