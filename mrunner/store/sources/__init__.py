"""The models other tools keep on this machine, found where each keeps them and imported without a copy.

One module per tool: C{ollama} (its store of manifests and blobs), C{hf_cache}
(the Hugging Face cache, snapshots linked into blobs), C{lmstudio} (its folder of
publishers and repositories), C{llamacpp} (its ``-hf`` downloads). Each lists
L{Found} models; C{folders} holds what they share (GGUF files grouped into
models, paths checked to stay inside their folder); C{catalog} asks them all and
says which the store has; C{linking} brings one into the store as hard links.
"""
