"""`flashd http`: OpenAI- and Anthropic-compatible HTTP gateway, a thin client of the daemon.

app.py (the ASGI app, errors, API key) -> openai_api.py / anthropic_api.py (endpoints and wire
formats) -> generation.py (a generation independent of dialect) -> daemon_link.py (the ZeroMQ
client, tokenizer and chat template, async bridge). tools.py parses tool calls in the output,
prompts.py builds prompts, *_schemas.py are the request contracts, server.py is the CLI.
"""
