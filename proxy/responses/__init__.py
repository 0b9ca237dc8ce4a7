"""The Responses API (``/v1/responses``) on the chat pipeline: its request as a chat
conversation and back (items), its event stream (events), and its call (call)."""
