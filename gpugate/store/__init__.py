"""SQLite: events, lease history and measured envelopes, with schema migrations."""
