# The appliance image: one image, three roles (web, worker, beat) chosen by scripts/proc.sh, as `make run` does.
# The GUI's browser libraries are vendored in a stage of their own (scripts/vendor-js.sh), so the image has no npm.
FROM node:20-bookworm-slim AS vendor
WORKDIR /src
COPY package.json package-lock.json ./
COPY scripts/vendor-js.sh scripts/vendor-js.sh
RUN FACTORY_CACHE_DIR=/tmp/cache scripts/vendor-js.sh

FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake ninja-build git curl redis-tools bubblewrap gettext \
      libgl1 libglib2.0-0 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# torch from PyPI is the CUDA build; point PIP_EXTRA_INDEX_URL at a CPU wheel index for a smaller CPU image.
ARG PIP_EXTRA_INDEX_URL=""
COPY requirements/constraints.txt requirements/constraints.txt
COPY scripts/build-llama.sh scripts/build-llama.sh
# llama.cpp (llama-server, llama-quantize and their libraries) compiles here once, in its own layer, so code changes
# do not rebuild it; llama-cpp-python installs without a llama.cpp of its own and loads the same libraries.
RUN sed 's/+cpu//' requirements/constraints.txt > /tmp/constraints.txt \
 && llama=$(FACTORY_CACHE_DIR=/opt/aifactory scripts/build-llama.sh python | tail -n 1) \
 && ln -s "$llama/bin/llama-server" "$llama/bin/llama-quantize" /usr/local/bin/ \
 && CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" pip install --no-cache-dir -c /tmp/constraints.txt \
      torch "llama-cpp-python[server]" \
 && package_lib=$(python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")') \
 && mkdir -p "$package_lib" && cp -P "$llama/lib/"*.so* "$package_lib/"
COPY . .
COPY --from=vendor /src/static/vendor static/vendor
RUN pip install --no-cache-dir -c /tmp/constraints.txt -e .

ENV FACTORY_DATA_DIR=/data FACTORY_HOST=0.0.0.0 FACTORY_PORT=8000 PYTHONUNBUFFERED=1
VOLUME /data
EXPOSE 8000
ENTRYPOINT ["scripts/proc.sh"]
CMD ["web"]
