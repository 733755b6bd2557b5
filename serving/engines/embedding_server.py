"""OpenAI-compatible embeddings engine for a sentence-transformers model.

It runs as its own process, so it imports nothing from the platform. It exists because infinity-emb, the usual
engine for this job, does not fit this stack: installing it downgrades huggingface-hub and transformers 5, and it
then fails to import. This engine is the small subset we need: `/health`, `/v1/models` and `/v1/embeddings`
(float or base64 output), with concurrent requests micro-batched into one `model.encode` call at a time.

    python -m serving.engines.embedding_server --model PATH --served-model-name NAME --host 127.0.0.1 --port 8001 \
        [--api-key-file FILE]

With --api-key-file every route but /health needs `Authorization: Bearer <key>` (the file's first line), as
llama-server's --api-key-file does.
"""

import os

# Weights come from a local path only; never let a missing file turn into a download attempt.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse  # noqa: E402
import asyncio  # noqa: E402
import base64  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import secrets  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

logger = logging.getLogger("embedding_server")

ENCODING_FORMATS = ("float", "base64")


class OpenAIError(Exception):
    """A client error, answered in OpenAI's error format so OpenAI clients raise their usual exceptions."""

    def __init__(self, status_code: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code


def error_response(status_code: int, message: str, *, param: str | None = None, code: str | None = None,
                   error_type: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": error_type, "param": param, "code": code}},
                        status_code=status_code)


@dataclass
class EncodedTexts:
    vectors: np.ndarray
    token_counts: list[int]


@dataclass
class _Piece:
    """Up to one batch worth of a request's texts, waiting for its vectors."""

    texts: list[str]
    result: asyncio.Future[EncodedTexts]


class MicroBatcher:
    """Collects texts from concurrent requests into batches and encodes one batch at a time on a single thread.

    One thread keeps the event loop free while torch runs, and one batch at a time lets torch use all its threads
    on one forward pass instead of competing passes.
    """

    def __init__(self, model: SentenceTransformer, *, max_batch_size: int, max_wait_s: float):
        self._model = model
        self._max_batch_size = max_batch_size
        self._max_wait_s = max_wait_s
        self._queue: asyncio.Queue[_Piece] = asyncio.Queue()
        self._carried: _Piece | None = None
        self._encoder_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")

    async def embed(self, texts: list[str]) -> EncodedTexts:
        loop = asyncio.get_running_loop()
        pieces = [_Piece(texts[start:start + self._max_batch_size], loop.create_future())
                  for start in range(0, len(texts), self._max_batch_size)]
        for piece in pieces:
            self._queue.put_nowait(piece)
        results = await asyncio.gather(*(piece.result for piece in pieces))
        return EncodedTexts(vectors=np.concatenate([result.vectors for result in results]),
                            token_counts=[count for result in results for count in result.token_counts])

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect_batch()
            texts = [text for piece in batch for text in piece.texts]
            try:
                encoded = await loop.run_in_executor(self._encoder_thread, self._encode, texts)
            except Exception as error:
                logger.exception("Encoding a batch of %d texts failed", len(texts))
                for piece in batch:
                    if not piece.result.done():
                        piece.result.set_exception(error)
                continue
            start = 0
            for piece in batch:
                end = start + len(piece.texts)
                # A client that disconnected has cancelled its future; its vectors are simply dropped.
                if not piece.result.done():
                    piece.result.set_result(EncodedTexts(encoded.vectors[start:end], encoded.token_counts[start:end]))
                start = end

    def close(self) -> None:
        self._encoder_thread.shutdown(wait=False, cancel_futures=True)

    async def _collect_batch(self) -> list[_Piece]:
        first = self._carried or await self._queue.get()
        self._carried = None
        batch, size = [first], len(first.texts)
        clock = asyncio.get_running_loop().time
        deadline = clock() + self._max_wait_s
        while size < self._max_batch_size:
            remaining = deadline - clock()
            if remaining <= 0:
                break
            try:
                piece = await asyncio.wait_for(self._queue.get(), remaining)
            except TimeoutError:
                break
            if size + len(piece.texts) > self._max_batch_size:
                self._carried = piece  # starts the next batch, so no batch grows past the limit
                break
            batch.append(piece)
            size += len(piece.texts)
        return batch

    def _encode(self, texts: list[str]) -> EncodedTexts:
        vectors = self._model.encode(texts, batch_size=len(texts), normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        # Counted as the model sees the text: with special tokens, truncated to its maximum sequence length.
        token_ids = self._model.tokenizer(texts, add_special_tokens=True, truncation=True,
                                          max_length=self._model.max_seq_length)["input_ids"]
        return EncodedTexts(vectors=vectors, token_counts=[len(ids) for ids in token_ids])


@dataclass
class EmbeddingRequest:
    texts: list[str]
    encoding_format: str


def parse_embedding_request(body: Any, *, served_model_name: str, dimension: int) -> EmbeddingRequest:
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(400, "'model' is required and must be a string.", param="model")
    if model != served_model_name:
        raise OpenAIError(404, f"The model '{model}' does not exist; this engine serves '{served_model_name}'.",
                          param="model", code="model_not_found")
    texts = _parse_input(body.get("input"))
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise OpenAIError(400, f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}.",
                          param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or dimensions != dimension):
        raise OpenAIError(400, f"'dimensions' must be {dimension} for this model; it cannot be shortened.",
                          param="dimensions")
    return EmbeddingRequest(texts=texts, encoding_format=encoding_format)


def _parse_input(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise OpenAIError(400, "'input' must be a non-empty string or a non-empty list of strings.", param="input")
    if not all(isinstance(text, str) for text in texts):
        raise OpenAIError(400, "'input' must contain strings; token arrays are not supported by this engine.",
                          param="input")
    if not all(texts):
        raise OpenAIError(400, "'input' must not contain empty strings.", param="input")
    return texts


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def create_app(model: SentenceTransformer, *, served_model_name: str, max_batch_size: int,
               max_wait_ms: float, api_key: str | None = None) -> Starlette:
    dimension = model.get_embedding_dimension()

    def require_key(request: Request) -> None:
        if api_key and not secrets.compare_digest(request.headers.get("authorization", "").encode(),
                                                  f"Bearer {api_key}".encode()):
            raise OpenAIError(401, "Invalid API key.", code="invalid_api_key")
    created = int(time.time())
    batcher = MicroBatcher(model, max_batch_size=max_batch_size, max_wait_s=max_wait_ms / 1000)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def list_models(request: Request) -> JSONResponse:
        require_key(request)
        return JSONResponse({"object": "list", "data": [
            {"id": served_model_name, "object": "model", "created": created, "owned_by": "ai-factory"},
        ]})

    async def create_embeddings(request: Request) -> JSONResponse:
        require_key(request)
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise OpenAIError(400, "The request body is not valid JSON.") from None
        parsed = parse_embedding_request(body, served_model_name=served_model_name, dimension=dimension)
        encoded = await batcher.embed(parsed.texts)
        prompt_tokens = sum(encoded.token_counts)
        return JSONResponse({
            "object": "list",
            "data": [{"object": "embedding", "index": index, "embedding": encode_vector(vector, parsed.encoding_format)}
                     for index, vector in enumerate(encoded.vectors)],
            "model": served_model_name,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        })

    async def on_openai_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, OpenAIError)
        return error_response(error.status_code, error.message, param=error.param, code=error.code)

    async def on_http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        return error_response(error.status_code, error.detail)

    async def on_server_error(request: Request, error: Exception) -> JSONResponse:
        return error_response(500, "The embedding engine hit an internal error.", error_type="server_error")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        batching = asyncio.create_task(batcher.run())
        yield
        batching.cancel()
        batcher.close()

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", list_models),
            Route("/v1/embeddings", create_embeddings, methods=["POST"]),
        ],
        exception_handlers={OpenAIError: on_openai_error, HTTPException: on_http_error, Exception: on_server_error},
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="local directory of a sentence-transformers model")
    parser.add_argument("--served-model-name", required=True, help="the name clients pass as 'model'")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=64, help="most texts encoded in one call")
    parser.add_argument("--max-wait-ms", type=float, default=5,
                        help="how long a batch waits for more requests before it is encoded")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--api-key-file", help="a file whose first line is the key every request must bring")
    args = parser.parse_args()
    if args.max_batch_size < 1:
        parser.error("--max-batch-size must be at least 1")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.model)
    logger.info("Loaded %s (%d dimensions) from %s on %s", args.served_model_name, model.get_embedding_dimension(),
                args.model, model.device)
    api_key = open(args.api_key_file).readline().strip() if args.api_key_file else None
    app = create_app(model, served_model_name=args.served_model_name, max_batch_size=args.max_batch_size,
                     max_wait_ms=args.max_wait_ms, api_key=api_key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
