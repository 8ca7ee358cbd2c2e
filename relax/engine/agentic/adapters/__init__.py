"""Environments served as services, as `BaseInteractionEnv`s for the built-in multi-turn rollout
(docs/agentic.md, "Environments as services: OpenEnv and MCP"):

- `openenv.OpenEnvEnv`: an OpenEnv environment server, through `openenv-core`'s client;
- `mcp.MCPToolEnv`: the tools of an MCP server (stdio or streamable HTTP), through the `mcp` SDK.

Each module imports its package when it is imported (`pip install 'relax-rl[agents]'`); this
package imports neither.
"""
