"""One agent: a multi-turn conversation with tools, think time and a round cap. Opens no sockets itself."""
