"""The tfcoord coordinator: pure state machine, asyncio server, journal, embedded mode."""
