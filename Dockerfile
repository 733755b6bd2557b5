# The appliance image: one image, three roles (web, worker, beat) chosen by scripts/proc.sh, as `make run` does.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git curl redis-tools \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# torch from PyPI is the CUDA build; point PIP_EXTRA_INDEX_URL at a CPU wheel index for a smaller CPU image.
ARG PIP_EXTRA_INDEX_URL=""
COPY requirements/constraints.txt requirements/constraints.txt
# llama-cpp-python compiles here once, in its own layer, so code changes do not rebuild it.
RUN sed 's/+cpu//' requirements/constraints.txt > /tmp/constraints.txt \
 && CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install --no-cache-dir -c /tmp/constraints.txt torch "llama-cpp-python[server]"
COPY . .
RUN pip install --no-cache-dir -c /tmp/constraints.txt -e .

ENV FACTORY_DATA_DIR=/data FACTORY_HOST=0.0.0.0 FACTORY_PORT=8000 PYTHONUNBUFFERED=1
VOLUME /data
EXPOSE 8000
ENTRYPOINT ["scripts/proc.sh"]
CMD ["web"]
