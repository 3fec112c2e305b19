"""Sends a PyTorch state_dict to a running `jambo serve --backend cuda --enable-control-endpoints` on the same GPU
by CUDA IPC (POST /update_weights_from_ipc): no file in between, jambo copies each tensor device to device, checks
every name, shape, dtype and value first, and answers once the new weights serve. Standard library plus torch.

    from jambo_ipc import send_state_dict
    send_state_dict("http://127.0.0.1:8000", model.state_dict(), "step-12", api_key=key, dtype=torch.bfloat16)

The names are transformers' JambaForCausalLM's (fused experts too). A tensor that shares its memory with one sent
before (a tied lm_head) is left out. With `dtype`, tensors of another floating type are cast first (jambo takes the
serving checkpoint's dtype only); the casts live until jambo has answered.
"""
import base64
import json
import urllib.error
import urllib.request

import torch

_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def ipc_entry(name, tensor, counters):
    """One entry of the request: where the tensor lies in its CUDA allocation, and the allocation's IPC handle. The
    sharing's reference counter goes to `counters`, to be released once jambo has copied the tensor."""
    storage = tensor.untyped_storage()
    _device, handle, _size, storage_offset, counter_handle, counter_offset, *_ = storage._share_cuda_()
    counters.append((counter_handle, counter_offset))
    # PyTorch's handle is a version byte, a kind byte ("c": cudaMalloc'd, "e": an expandable segment), then the
    # 64-byte cudaIpcMemHandle_t.
    if len(handle) == 66 and handle[1:2] == b"e":
        raise ValueError(f"{name}: lies in an expandable segment, which CUDA IPC handles cannot share; run the "
                         "trainer without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if len(handle) == 66:
        handle = handle[2:]
    return {
        "name": name,
        "dtype": _DTYPES[tensor.dtype],
        "shape": list(tensor.shape),
        "ipc_handle": base64.b64encode(handle).decode("ascii"),
        "offset": storage_offset + tensor.storage_offset() * tensor.element_size(),
    }


def send_state_dict(url, state_dict, weight_version, api_key=None, dtype=None, timeout=600):
    """POSTs the tensors; returns jambo's answer (a dict), or raises RuntimeError with jambo's error message."""
    kept, entries, seen, counters = [], [], set(), []
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        if not tensor.is_cuda:
            raise ValueError(f"{name}: on {tensor.device}, not a CUDA device")
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)  # before any cast: a tied copy shares it
        if key in seen:
            continue
        seen.add(key)
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        tensor = tensor.contiguous()
        kept.append(tensor)
        entries.append(ipc_entry(name, tensor, counters))
    torch.cuda.synchronize()  # every cast and copy is in memory before jambo reads it
    body = json.dumps({"tensors": entries, "weight_version": weight_version}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url.rstrip("/") + "/update_weights_from_ipc", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"jambo refused the update ({error.code}): {error.read().decode()}") from None
    finally:
        # jambo has copied the tensors (or refused them) and closed its mappings: the receiver's share of each
        # sharing is released here, so that PyTorch frees the memory once the trainer drops it.
        for counter_handle, counter_offset in counters:
            torch.UntypedStorage._release_ipc_counter_cuda(counter_handle, counter_offset)
        del kept
        torch.cuda.ipc_collect()
