"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) as a
translation onto the chat-completions path (frontend/chat_bridge.py): request.py reads the
body into a chat body, answer.py and stream.py turn the chat answer into a message or
Anthropic's event stream, errors.py gives every refusal Anthropic's error shape, routes.py
serves them."""
