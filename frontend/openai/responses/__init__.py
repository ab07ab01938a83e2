"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) as a
translation onto the chat-completions path (frontend/chat_bridge.py): request.py reads the
body into a chat body, answer.py and stream.py turn the chat answer into a Response object
or the Responses event stream, store.py keeps finished responses for previous_response_id,
routes.py serves them."""
