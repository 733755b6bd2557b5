"""How RAG Studio calls models: through the platform's own OpenAI-compatible gateway, with the workspace's
service token, so every call is routed, failed over and measured like any other."""

from django.conf import settings
from openai import OpenAI

from accounts.services import service_token


def openai_client(workspace_id: int, *, timeout: float = 120) -> OpenAI:
    return OpenAI(base_url=settings.GATEWAY_URL, api_key=service_token(workspace_id=workspace_id), timeout=timeout,
                  max_retries=0)


def chat_model(workspace_id: int, model: str, *, temperature: float = 0.2, max_tokens: int = 256):
    """The answer step's model. LangChain's ChatOpenAI rather than the openai client because a RAG template is a
    runnable (prompt | model) that streams with the same code as it answers, and because Agent Studio hands the
    same models and knowledge bases to LangGraph, which speaks LangChain chat models. One-shot calls (rerank, eval
    generation, judging) use `openai_client`."""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=settings.GATEWAY_URL, api_key=service_token(workspace_id=workspace_id),
                      model=model, temperature=temperature, max_tokens=max_tokens, max_retries=0, timeout=300,
                      # A request queued behind busy slots waits for its first token longer than LangChain's default
                      # 120 s between chunks.
                      stream_usage=True, stream_chunk_timeout=300)
