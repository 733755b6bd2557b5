"""The gateway's and the published apps' public API as an OpenAPI document: they are served past Django (the ASGI
edge), so drf-spectacular's /api/schema/ does not describe them. bench.fuzz fuzzes them from it; bench.spec_corpus
imports it as one of its real-world documents."""

GATEWAY_AND_APPS = {
    "openapi": "3.0.3",
    "info": {"title": "AI Factory gateway and app API", "version": "1"},
    "components": {"securitySchemes": {"key": {"type": "http", "scheme": "bearer"}}},
    "security": [{"key": []}],
    "paths": {
        "/v1/models": {"get": {"responses": {"200": {"description": "models"}}}},
        **{f"/v1/{endpoint}": {"post": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "model": {"type": "string"}, "stream": {"type": "boolean"},
                    "max_tokens": {"type": "integer"}, "prompt": {}, "input": {},
                    "messages": {"type": "array", "items": {"type": "object", "properties": {
                        "role": {"type": "string"}, "content": {}}}},
                    "tools": {"type": "array", "items": {"type": "object"}}, "tool_choice": {},
                    "stream_options": {"type": "object"}}}}}},
            "responses": {"200": {"description": "answer"}}}}
            for endpoint in ("chat/completions", "completions", "embeddings")},
        **{f"/api/apps/{{slug}}/{endpoint}": {"post": {
            "parameters": [{"name": "slug", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "query": {}, "conversation_id": {}, "user": {}, "stream": {"type": "boolean"},
                    "message_id": {}, "rating": {"type": "string"}, "comment": {},
                    "messages": {"type": "array", "items": {"type": "object"}}}}}}},
            "responses": {"200": {"description": "answer"}}}}
            for endpoint in ("chat", "retrieve", "feedback", "v1/chat/completions")},
    },
}
