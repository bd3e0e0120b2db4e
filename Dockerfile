FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
COPY worker ./worker
RUN pip install --no-cache-dir ".[dashboard,console]"
CMD ["sessionfork", "worker"]
