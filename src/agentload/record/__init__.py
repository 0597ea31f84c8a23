"""``agentload record``: a proxy between a user's own agents and their server that records a replayable trace.

``proxy.py`` forwards and reads the answers, ``sessions.py`` tells the conversations apart, ``tokens.py`` gets
each prompt's tokens from the server and hashes their blocks, ``writer.py`` writes the conversation trace that
``workload/conversation_trace.py`` replays, ``app.py`` checks the settings and serves. docs/record.md says what
is recorded and what is not.
"""
