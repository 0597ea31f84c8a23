"""What agents do under load: agentic sessions, the matched synthetic arm, the behaviour suite, trace replay."""
