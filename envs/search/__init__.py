"""Search task: retrieval (BM25 / dense, in process or over HTTP), the multi-turn search environment,
QA loaders and a generated CPU-scale knowledge base. Importing this package registers ``"search"``
with ``envs.make_env``; heavy dependencies (bm25s, faiss, sentence-transformers, fastapi) load lazily."""
from envs.search.client import RetrievalClient
from envs.search.corpus import Corpus, load_corpus, load_paired_questions, resolve_corpus_path
from envs.search.env import SearchEnv, format_information, parse_action, render_history
from envs.search.retriever import RetrievalBatch, Retriever, SearchBackend, build_retriever
from envs.search.reward import exact_match, f1_score, normalize_answer

__all__ = ["Corpus", "RetrievalBatch", "RetrievalClient", "Retriever", "SearchBackend", "SearchEnv", "build_retriever",
           "exact_match", "f1_score", "format_information", "load_corpus", "load_paired_questions",
           "normalize_answer", "parse_action", "render_history", "resolve_corpus_path"]
