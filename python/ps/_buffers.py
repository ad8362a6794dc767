"""The memory of a caller's array, without a copy.

libps reads a push's gradient and writes a pull's weights in place, so what
it gets is the address of the caller's own memory: a CPU torch tensor's
data_ptr(), a numpy array's __array_interface__ pointer, or any other
object's buffer (PEP 3118).  Only contiguous float32 memory qualifies; any
other array is refused with a TypeError or ValueError that says what to pass
instead, never copied behind the caller's back and never handed to C.
"""

import ctypes
import sys

_LITTLE = sys.byteorder == "little"
_F32 = ("<f4", "=f4") if _LITTLE else (">f4", "=f4")

# numpy typestr -> a name a user recognises
_TYPES = {"f8": "float64", "f2": "float16", "i8": "int64", "i4": "int32", "i2": "int16",
          "i1": "int8", "u1": "uint8", "b1": "bool", "c8": "complex64", "c16": "complex128"}


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _from_torch(obj, what, writable):
    if obj.device.type != "cpu":
        raise TypeError("%s: a %s tensor; ps.Client moves host memory: pass tensor.cpu(), or "
                        "train through ps.torch, which stages GPU tensors" % (what, obj.device))
    if str(obj.dtype) != "torch.float32":
        raise TypeError("%s: dtype %s; ps moves float32: pass tensor.float() (a copy)"
                        % (what, str(obj.dtype).replace("torch.", "")))
    if not obj.is_contiguous():
        raise ValueError("%s: not contiguous (shape %s, strides %s): pass tensor.contiguous() "
                         "(a copy)" % (what, tuple(obj.shape), tuple(obj.stride())))
    return obj.data_ptr(), obj.numel(), obj


def _from_array_interface(obj, ai, what, writable):
    typestr = ai.get("typestr", "")
    if typestr not in _F32:
        name = _TYPES.get(typestr[1:], typestr)
        raise TypeError("%s: dtype %s; ps moves float32: pass x.astype(numpy.float32) (a copy)"
                        % (what, name))
    shape = tuple(ai.get("shape", ()))
    strides = ai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, 4):
        if any(n > 1 for n in shape):
            raise ValueError("%s: not contiguous (shape %s, strides %s): pass "
                             "numpy.ascontiguousarray(x) (a copy)" % (what, shape, tuple(strides)))
    data = ai.get("data")
    if not isinstance(data, tuple):
        raise TypeError("%s: its __array_interface__ gives no data pointer" % what)
    address, readonly = data
    if writable and readonly:
        raise ValueError("%s: read-only; a pull writes into it: pass a writable array" % what)
    count = 1
    for n in shape:
        count *= n
    return address, count, obj


def _from_buffer(obj, what, writable):
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError("%s: a %s is no array: pass a float32 numpy array or a CPU torch tensor"
                        % (what, type(obj).__name__)) from None
    if mv.format not in ("f", "<f", "=f") or mv.itemsize != 4:
        raise TypeError("%s: buffer format %r; ps moves float32 ('f')" % (what, mv.format))
    if not mv.c_contiguous:
        raise ValueError("%s: buffer is not contiguous" % what)
    if mv.readonly:
        if writable:
            raise ValueError("%s: read-only; a pull writes into it" % what)
        try:
            import numpy
        except ImportError:
            raise TypeError("%s: a read-only buffer needs numpy to be addressed; pass a "
                            "writable one" % what) from None
        arr = numpy.frombuffer(mv, dtype=numpy.float32)
        return arr.__array_interface__["data"][0], arr.size, (obj, mv, arr)
    n = mv.nbytes
    if n == 0:
        return 0, 0, (obj, mv)
    cbuf = (ctypes.c_char * n).from_buffer(mv)
    return ctypes.addressof(cbuf), n // 4, (obj, mv, cbuf)


def float_buffer(obj, what, writable):
    """(address, float count, what to keep alive) of obj's memory.

    what names the argument in messages ("push of key 3: grad").  writable:
    the memory will be written (a pull's destination).  Raises TypeError for
    another dtype, a GPU tensor or a non-array, ValueError for memory that is
    not contiguous or read-only."""
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch(obj, what, writable)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return _from_array_interface(obj, ai, what, writable)
    return _from_buffer(obj, what, writable)
