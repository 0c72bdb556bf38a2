/*
 * nsqpy._speedups._hot: compiled twins of nsqd's per-message loops.
 *
 * Plain C on the CPython API (no build dependency beyond a C compiler and Python's headers).
 * Every function here has a pure-Python reference beside the code it accelerates, and the
 * two are tested against the same cases (tests/protocol/test_speedups.py,
 * tests/nsqd/test_speedups.py); NSQPY_PURE_PYTHON=1 runs the references instead.
 *
 *   decode_mpub      protocol/commands.py decode_mpub_py   MPUB body -> bodies
 *   fin_run          protocol/commands.py fin_run_py       a run of FINs applied to in-flight
 *   parse_line       protocol/commands.py (CommandParser.next) one command line -> params
 *   new_messages     nsqd/message.py new_messages_py       bodies + GUIDs -> Messages
 *   copy_messages    nsqd/message.py copy_messages_py      the topic -> channel copies
 *   send_batch       nsqd/client_v2.py send_batch_py       a client's batch of message frames
 *   expire_front     nsqd/inflight.py expire_front_py      timed-out and stale deadline entries
 *   encode_messages  nsqd/channel.py encode_messages_py    Messages -> DiskQueue records
 *   decode_records   nsqd/channel.py decode_records_py     DiskQueue records -> Messages
 *   frame_records    nsqd/diskqueue.py frame_records_py    records -> [len][record]...
 *   split_records    nsqd/diskqueue.py split_records_py    [len][record]... -> records
 *   scan_frames      spark/burst.py scan_frames_py         nsqd's frame stream -> Arrow column buffers
 *   tune_malloc      nsqd/main.py tune_malloc              glibc's mallopt (no Python twin: the
 *                                                          pure-Python daemon leaves malloc as is)
 *
 * Fast paths validate and never explain: on input the reference would reject (or that
 * this code does not handle) they return None, and the caller runs the reference, which
 * raises the exact error. The wire layout is not written here: set_layout() takes it from
 * protocol/frames.py, and set_message_type() the slots of nsqd/message.py's Message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#ifndef T_OBJECT_EX
#define T_OBJECT_EX 16
#endif

/* bumped whenever a signature changes: the wiring refuses a stale build */
#define HOT_API_VERSION 5

/* --- the layout (protocol/frames.py) ----------------------------------------------------- */

static int layout_set = 0;
static Py_ssize_t ID_LEN = 16;        /* MSG_ID_LENGTH */
static Py_ssize_t HEADER_SIZE = 30;   /* MESSAGE_HEADER_SIZE: type + ts + attempts + id */
static int32_t FRAME_MESSAGE = 2;     /* FRAME_TYPE_MESSAGE */
static Py_ssize_t ID_AT = 10;         /* MESSAGE_ID_OFFSET in a stored message */
static Py_ssize_t BODY_AT = 26;       /* MESSAGE_BODY_OFFSET */

/* --- the Message class (nsqd/message.py): its __slots__ offsets -------------------------- */

enum { F_ID, F_BODY, F_TS, F_ATTEMPTS, F_CLIENT, F_DEADLINE, F_DELIVERY, F_DEFER, F_COUNT };
static const char *FIELD_NAMES[F_COUNT] = {
    "id", "body", "timestamp", "attempts", "client", "deadline", "delivery_ts", "defer",
};
static PyObject *field_names[F_COUNT];    /* interned */
static PyTypeObject *msg_type = NULL;     /* strong reference */
static Py_ssize_t off[F_COUNT];

static PyObject *zero_float;              /* 0.0 */
static PyObject *zero_int;                /* 0 */
static PyObject *str_popleft, *str_extend;

#define SLOT(o, f) (*(PyObject **)((char *)(o) + off[f]))

/* o.<field> as a new reference (any object; the slot directly for an exact Message) */
static inline PyObject *
mget(PyObject *o, int f)
{
    if (Py_TYPE(o) == msg_type) {
        PyObject *v = SLOT(o, f);
        if (v == NULL) {
            PyErr_SetObject(PyExc_AttributeError, field_names[f]);
            return NULL;
        }
        return Py_NewRef(v);
    }
    return PyObject_GetAttr(o, field_names[f]);
}

/* o.<field> = v (v borrowed) */
static inline int
mset(PyObject *o, int f, PyObject *v)
{
    if (Py_TYPE(o) == msg_type) {
        PyObject *old = SLOT(o, f);
        SLOT(o, f) = Py_NewRef(v);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(o, field_names[f], v);
}

/* A new Message, every slot set (all arguments borrowed).
 *
 * It is not tracked by the cyclic GC: while it is not in flight it refers only to bytes,
 * ints and floats, so it cannot be part of a cycle, and millions of queued messages would
 * otherwise be walked by every young-generation collection they survive (that cost more
 * than making them). send_batch() tracks a message as it puts it in flight (its client
 * refers back to it through the channel), as does putting it back for the reference. */
static PyObject *
new_message(PyObject *id, PyObject *body, PyObject *ts, PyObject *attempts, PyObject *defer)
{
    PyObject *m = msg_type->tp_alloc(msg_type, 0);
    if (m == NULL)
        return NULL;
    if (PyObject_GC_IsTracked(m))
        PyObject_GC_UnTrack(m);
    SLOT(m, F_ID) = Py_NewRef(id);
    SLOT(m, F_BODY) = Py_NewRef(body);
    SLOT(m, F_TS) = Py_NewRef(ts);
    SLOT(m, F_ATTEMPTS) = Py_NewRef(attempts);
    SLOT(m, F_CLIENT) = Py_NewRef(Py_None);
    SLOT(m, F_DEADLINE) = Py_NewRef(zero_float);
    SLOT(m, F_DELIVERY) = Py_NewRef(zero_float);
    SLOT(m, F_DEFER) = Py_NewRef(defer);
    return m;
}

static int
need_message_type(void)
{
    if (msg_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_hot.set_message_type() was not called");
        return -1;
    }
    return 0;
}

static PyObject *
set_message_type(PyObject *self, PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "set_message_type() needs a class");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)type;
    Py_ssize_t offs[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        /* a __slots__ member of this very class, holding any object */
        PyObject *d = PyDict_GetItemWithError(tp->tp_dict, field_names[f]);
        if (d == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "%s has no slot %R", tp->tp_name, field_names[f]);
            return NULL;
        }
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a __slots__ member", tp->tp_name,
                         field_names[f]);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0 ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", tp->tp_name,
                         field_names[f]);
            return NULL;
        }
        offs[f] = m->offset;
    }
    memcpy(off, offs, sizeof(off));
    Py_INCREF(type);
    Py_XSETREF(msg_type, tp);
    Py_RETURN_NONE;
}

static PyObject *
set_layout(PyObject *self, PyObject *args)
{
    Py_ssize_t id_len, header_size, id_at, body_at;
    int frame_type;
    if (!PyArg_ParseTuple(args, "nninn", &id_len, &header_size, &frame_type, &id_at, &body_at))
        return NULL;
    /* the frame: [u32 size][i32 type][i64 ts][u16 attempts][id][body]; stored: from ts on */
    if (id_len <= 0 || header_size != 4 + 8 + 2 + id_len || id_at != 8 + 2 ||
        body_at != id_at + id_len) {
        PyErr_SetString(PyExc_ValueError, "the message layout is not the one this build knows");
        return NULL;
    }
    ID_LEN = id_len;
    HEADER_SIZE = header_size;
    FRAME_MESSAGE = frame_type;
    ID_AT = id_at;
    BODY_AT = body_at;
    layout_set = 1;
    Py_RETURN_NONE;
}

static int
need_layout(void)
{
    if (!layout_set) {
        PyErr_SetString(PyExc_RuntimeError, "_hot.set_layout() was not called");
        return -1;
    }
    return 0;
}

/* --- big-endian helpers ------------------------------------------------------------------ */

static inline int32_t
get_i32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline void
put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void
put_u64(unsigned char *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static inline int64_t
get_i64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

/* --- decode_mpub --------------------------------------------------------------------------- */

PyDoc_STRVAR(decode_mpub_doc,
"decode_mpub(body, max_msg_size, max_body_size) -> list[bytes] | None\n\n"
"Split an MPUB body [int32 num]([int32 size][bytes])* (bytes or a bytearray) into bytes;\n"
"None if decode_mpub_py would raise.");

static PyObject *
decode_mpub(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode_mpub() takes 3 arguments");
        return NULL;
    }
    PyObject *body = args[0];
    const unsigned char *p;
    Py_ssize_t blen;
    /* a bytearray (a body received in place) is only read here: nothing runs Python code
     * meanwhile, so it cannot be resized under us */
    if (PyBytes_CheckExact(body)) {
        p = (const unsigned char *)PyBytes_AS_STRING(body);
        blen = PyBytes_GET_SIZE(body);
    } else if (PyByteArray_CheckExact(body)) {
        p = (const unsigned char *)PyByteArray_AS_STRING(body);
        blen = PyByteArray_GET_SIZE(body);
    } else {
        Py_RETURN_NONE;
    }
    long long max_msg = PyLong_AsLongLong(args[1]);
    long long max_body = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (blen < 4 || max_body < 4)
        Py_RETURN_NONE;
    long long num = get_i32(p);
    long long max_messages = (max_body - 4) / 5;
    if (num <= 0 || num > max_messages)
        Py_RETURN_NONE;
    /* check everything first: the list is built only for a valid body */
    Py_ssize_t pos = 4;
    for (long long i = 0; i < num; i++) {
        if (pos + 4 > blen)
            Py_RETURN_NONE;
        int32_t size = get_i32(p + pos);
        pos += 4;
        if (size <= 0 || size > max_msg || pos + size > blen)
            Py_RETURN_NONE;
        pos += size;
    }
    PyObject *out = PyList_New((Py_ssize_t)num);
    if (out == NULL)
        return NULL;
    pos = 4;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)num; i++) {
        int32_t size = get_i32(p + pos);
        pos += 4;
        PyObject *b = PyBytes_FromStringAndSize((const char *)p + pos, size);
        if (b == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, b);
        pos += size;
    }
    return out;
}

/* --- new_messages: bodies + their GUIDs ----------------------------------------------------- */

static const char HEX[] = "0123456789abcdef";

PyDoc_STRVAR(new_messages_doc,
"new_messages(bodies, ts, seq, node, twepoch, timestamp, defer) -> list[Message] | None\n\n"
"One Message per body, the k-th with the GUID of sequence number seq + k from time unit ts\n"
"(nsqd/guid.py: ((ts + s // 4096 - twepoch) << 22) | node | s % 4096, as 16 hex digits).");

static PyObject *
new_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "new_messages() takes 7 arguments");
        return NULL;
    }
    if (need_message_type() < 0)
        return NULL;
    PyObject *bodies = args[0];
    if (!PyList_CheckExact(bodies)) {
        PyErr_SetString(PyExc_TypeError, "new_messages() needs a list of bodies");
        return NULL;
    }
    long long ts = PyLong_AsLongLong(args[1]);
    long long seq = PyLong_AsLongLong(args[2]);
    long long node = PyLong_AsLongLong(args[3]);
    long long twepoch = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *timestamp = args[5];
    PyObject *defer = args[6];
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (ts < twepoch || seq < 0 || node < 0 || ts - twepoch + ((seq + n) >> 12) >= (1LL << 41))
        Py_RETURN_NONE;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        long long s = seq + k;
        uint64_t v = ((uint64_t)(ts + (s >> 12) - twepoch) << 22) | (uint64_t)node |
                     (uint64_t)(s & 0xFFF);
        PyObject *id = PyBytes_FromStringAndSize(NULL, 16);
        if (id == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        char *h = PyBytes_AS_STRING(id);
        for (int i = 15; i >= 0; i--) {
            h[i] = HEX[v & 15];
            v >>= 4;
        }
        PyObject *m = new_message(id, PyList_GET_ITEM(bodies, k), timestamp, zero_int, defer);
        Py_DECREF(id);
        if (m == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, m);
    }
    return out;
}

/* --- copy_messages: a channel's own copies -------------------------------------------------- */

PyDoc_STRVAR(copy_messages_doc,
"copy_messages(msgs) -> list[Message]\n\n"
"[m.copy() for m in msgs]: new Messages sharing id, body and timestamp, with the same\n"
"attempts and defer, not in flight.");

static PyObject *
copy_messages(PyObject *self, PyObject *msgs)
{
    if (need_message_type() < 0)
        return NULL;
    if (!PyList_CheckExact(msgs)) {
        PyErr_SetString(PyExc_TypeError, "copy_messages() needs a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *src = PyList_GET_ITEM(msgs, i);
        PyObject *m;
        if (Py_TYPE(src) == msg_type && SLOT(src, F_ID) && SLOT(src, F_BODY) && SLOT(src, F_TS) &&
            SLOT(src, F_ATTEMPTS) && SLOT(src, F_DEFER)) {
            m = new_message(SLOT(src, F_ID), SLOT(src, F_BODY), SLOT(src, F_TS),
                            SLOT(src, F_ATTEMPTS), SLOT(src, F_DEFER));
        }
        else {
            m = PyObject_CallMethod(src, "copy", NULL);
        }
        if (m == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, m);
    }
    return out;
}

/* --- send_batch: a client's message frames -------------------------------------------------- */

PyDoc_STRVAR(send_batch_doc,
"send_batch(queue, n, owner, in_flight, entries, deadline, now, out[, sample, randrange\n"
"           [, expire_before, max_attempts, rejected]]) -> (sent, nbytes) | None\n\n"
"Pop up to n messages off the queue (a deque) and put them in flight to owner (a copy of\n"
"a message queued by several channels, whose deadline is message.SHARED): attempts + 1,\n"
"client, deadline and delivery_ts set, indexed in in_flight by id, (deadline, msg) appended\n"
"to entries (a deque). Their frames go to the list out as one bytes object (a body of\n"
"LARGE_BODY bytes or more follows its frame header as it is, uncopied). None (nothing\n"
"changed) if a message cannot be framed: the reference then raises as it always did. With\n"
"sample (1-99), a message is dropped unless randrange(100) <= sample. A message published\n"
"before expire_before (ns, 0: none) or with max_attempts attempts made (0: none) is not sent\n"
"but appended to the list rejected.");

/* a body at least this long is not copied into a batch's frames: it goes to the output
 * list as it is, after its frame header (client_v2.LARGE_BODY) */
#define LARGE_BODY (16 * 1024)

/* what pass 1 learns of each message */
typedef struct {
    long long ts;
    long attempts;   /* after the increment */
    Py_ssize_t blen;
} framed_t;

static PyObject *
send_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && nargs != 10 && nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "send_batch() takes 8, 10 or 13 arguments");
        return NULL;
    }
    long sample = 0;
    PyObject *randrange = NULL;
    if (nargs >= 10) {
        sample = PyLong_AsLong(args[8]);
        if (sample == -1 && PyErr_Occurred())
            return NULL;
        randrange = args[9];
    }
    long long expire_before = 0;
    long max_attempts = 0;
    PyObject *rejected = NULL;
    if (nargs == 13) {
        expire_before = PyLong_AsLongLong(args[10]);
        if (expire_before == -1 && PyErr_Occurred())
            return NULL;
        max_attempts = PyLong_AsLong(args[11]);
        if (max_attempts == -1 && PyErr_Occurred())
            return NULL;
        rejected = args[12];
        if (!PyList_Check(rejected)) {
            PyErr_SetString(PyExc_TypeError, "send_batch(): rejected must be a list");
            return NULL;
        }
    }
    int filtering = expire_before > 0 || max_attempts > 0;
    if (need_layout() < 0)
        return NULL;
    PyObject *q = args[0];
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PyObject *owner = args[2], *in_flight = args[3], *entries = args[4];
    PyObject *deadline = args[5], *now = args[6], *out = args[7];
    if (!PyDict_Check(in_flight) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "send_batch(): in_flight must be a dict, out a list");
        return NULL;
    }
    Py_ssize_t avail = PyObject_Length(q);
    if (avail < 0)
        return NULL;
    if (n > avail)
        n = avail;
    if (n <= 0)
        return Py_BuildValue("(nn)", (Py_ssize_t)0, (Py_ssize_t)0);

    PyObject *batch = PyList_New(n);      /* the popped messages */
    PyObject *ents = NULL;                /* their (deadline, msg) entries */
    PyObject *frames = NULL;
    framed_t *info = PyMem_Malloc(sizeof(framed_t) * (size_t)n);
    PyObject *qargs[2] = {NULL, q};
    Py_ssize_t got = 0;
    if (batch == NULL || info == NULL) {
        if (info == NULL)
            PyErr_NoMemory();
        goto fail;
    }
    while (got < n) {
        if (sample || filtering) {
            Py_ssize_t left = PyObject_Length(q);
            if (left < 0)
                goto fail;
            if (left == 0)
                break;
        }
        PyObject *m = PyObject_VectorcallMethod(str_popleft, qargs + 1,
                                                1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (m == NULL)
            goto fail;
        if (sample) {
            /* the reference's "randrange(100) > sample: skip it" (it is dropped) */
            PyObject *r = PyObject_CallFunction(randrange, "i", 100);
            long draw = r ? PyLong_AsLong(r) : -1;
            Py_XDECREF(r);
            if (draw == -1 && PyErr_Occurred()) {
                Py_DECREF(m);
                goto fail;
            }
            if (draw > sample) {
                Py_DECREF(m);
                continue;
            }
        }
        if (filtering) {
            /* the reference's "expired or out of attempts: rejected, not sent" */
            int out_of_it = 0;
            if (expire_before > 0) {
                PyObject *ts = mget(m, F_TS);
                long long t = ts ? PyLong_AsLongLong(ts) : -1;
                Py_XDECREF(ts);
                if (t == -1 && PyErr_Occurred()) {
                    Py_DECREF(m);
                    goto fail;
                }
                out_of_it = t < expire_before;
            }
            if (!out_of_it && max_attempts > 0) {
                PyObject *at = mget(m, F_ATTEMPTS);
                long a = at ? PyLong_AsLong(at) : -1;
                Py_XDECREF(at);
                if (a == -1 && PyErr_Occurred()) {
                    Py_DECREF(m);
                    goto fail;
                }
                out_of_it = a >= max_attempts;
            }
            if (out_of_it) {
                int err = PyList_Append(rejected, m);
                Py_DECREF(m);
                if (err < 0)
                    goto fail;
                continue;
            }
        }
        PyList_SET_ITEM(batch, got, m);
        got++;
    }
    if (got < n) {
        /* sampling or the filter skipped some and the queue ran dry */
        if (got == 0) {
            Py_DECREF(batch);
            PyMem_Free(info);
            return Py_BuildValue("(nn)", (Py_ssize_t)0, (Py_ssize_t)0);
        }
        if (PyList_SetSlice(batch, got, n, NULL) < 0)
            goto fail;
        n = got;
    }
    /* pass 1: read and check, change nothing; sizes for one allocation */
    Py_ssize_t total = 0;
    int usable = 1;
    for (Py_ssize_t i = 0; i < n && usable; i++) {
        PyObject *m = PyList_GET_ITEM(batch, i);
        if (Py_TYPE(m) != msg_type || !SLOT(m, F_ID) || !SLOT(m, F_BODY) || !SLOT(m, F_TS) ||
            !SLOT(m, F_ATTEMPTS)) {
            usable = 0;
            break;
        }
        PyObject *id = SLOT(m, F_ID), *body = SLOT(m, F_BODY);
        PyObject *ts = SLOT(m, F_TS), *at = SLOT(m, F_ATTEMPTS);
        if (!PyBytes_Check(id) || PyBytes_GET_SIZE(id) != ID_LEN || !PyBytes_Check(body) ||
            !PyLong_CheckExact(ts) || !PyLong_CheckExact(at)) {
            usable = 0;
            break;
        }
        int overflow = 0;
        long long t = PyLong_AsLongLongAndOverflow(ts, &overflow);
        long a = overflow ? 0 : PyLong_AsLongAndOverflow(at, &overflow);
        if (overflow || a < 0 || a >= 0xFFFF) {
            usable = 0;
            break;
        }
        info[i].ts = t;
        info[i].attempts = a + 1;
        info[i].blen = PyBytes_GET_SIZE(body);
        total += 4 + HEADER_SIZE + info[i].blen;
    }
    if (!usable) {
        /* put them back as they were, in order, for the reference (which may put them in
         * flight: tracked from now on) */
        for (Py_ssize_t i = n - 1; i >= 0; i--) {
            PyObject *m = PyList_GET_ITEM(batch, i);
            if (PyType_IS_GC(Py_TYPE(m)) && !PyObject_GC_IsTracked(m))
                PyObject_GC_Track(m);
        }
        for (Py_ssize_t i = n - 1; i >= 0; i--) {
            PyObject *r = PyObject_CallMethod(q, "appendleft", "O", PyList_GET_ITEM(batch, i));
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        }
        Py_DECREF(batch);
        PyMem_Free(info);
        Py_RETURN_NONE;
    }
    ents = PyList_New(n);
    if (ents == NULL)
        goto fail;
    unsigned char *w = NULL;
    /* pass 2: in flight, and framed: frames and small bodies copied into runs, each run
     * one bytes object; a large body ends its run and goes to out as it is (no copy) */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (frames == NULL) {
            Py_ssize_t run = 0;
            for (Py_ssize_t j = i; j < n; j++) {
                run += 4 + HEADER_SIZE;
                if (info[j].blen >= LARGE_BODY)
                    break;
                run += info[j].blen;
            }
            frames = PyBytes_FromStringAndSize(NULL, run);
            if (frames == NULL)
                goto fail;
            w = (unsigned char *)PyBytes_AS_STRING(frames);
        }
        PyObject *m = PyList_GET_ITEM(batch, i);
        PyObject *dl = SLOT(m, F_DEADLINE);
        if (dl != NULL && PyFloat_CheckExact(dl) && PyFloat_AS_DOUBLE(dl) < 0.0) {
            /* queued by several channels (message.SHARED): this channel's own copy goes */
            PyObject *defer = SLOT(m, F_DEFER);
            PyObject *c = new_message(SLOT(m, F_ID), SLOT(m, F_BODY), SLOT(m, F_TS),
                                      SLOT(m, F_ATTEMPTS), defer ? defer : zero_float);
            if (c == NULL)
                goto fail;
            PyList_SET_ITEM(batch, i, c);
            Py_DECREF(m);
            m = c;
        }
        PyObject *v = PyLong_FromLong(info[i].attempts);
        if (v == NULL)
            goto fail;
        Py_SETREF(SLOT(m, F_ATTEMPTS), v);
        if (!PyObject_GC_IsTracked(m))
            PyObject_GC_Track(m);
        Py_XSETREF(SLOT(m, F_CLIENT), Py_NewRef(owner));
        Py_XSETREF(SLOT(m, F_DEADLINE), Py_NewRef(deadline));
        Py_XSETREF(SLOT(m, F_DELIVERY), Py_NewRef(now));
        PyObject *id = SLOT(m, F_ID), *body = SLOT(m, F_BODY);
        if (PyDict_SetItem(in_flight, id, m) < 0)
            goto fail;
        PyObject *e = PyTuple_Pack(2, deadline, m);
        if (e == NULL)
            goto fail;
        PyList_SET_ITEM(ents, i, e);
        /* [u32 size][i32 type][i64 ts][u16 attempts][id][body] */
        Py_ssize_t blen = info[i].blen;
        long a = info[i].attempts;
        put_u32(w, (uint32_t)(HEADER_SIZE + blen));
        put_u32(w + 4, (uint32_t)FRAME_MESSAGE);
        put_u64(w + 8, (uint64_t)info[i].ts);
        w[16] = (unsigned char)(a >> 8);
        w[17] = (unsigned char)a;
        memcpy(w + 18, PyBytes_AS_STRING(id), ID_LEN);
        if (blen >= LARGE_BODY) {
            int err = PyList_Append(out, frames);
            Py_CLEAR(frames);
            if (err < 0 || PyList_Append(out, body) < 0)
                goto fail;
            continue;
        }
        memcpy(w + 18 + ID_LEN, PyBytes_AS_STRING(body), blen);
        w += 4 + HEADER_SIZE + blen;
    }
    PyObject *eargs[3] = {NULL, entries, ents};
    PyObject *r = PyObject_VectorcallMethod(str_extend, eargs + 1,
                                            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL)
        goto fail;
    Py_DECREF(r);
    if (frames != NULL && PyList_Append(out, frames) < 0)
        goto fail;
    Py_DECREF(batch);
    Py_DECREF(ents);
    Py_XDECREF(frames);
    PyMem_Free(info);
    return Py_BuildValue("(nn)", n, total);

fail:
    Py_XDECREF(batch);
    Py_XDECREF(ents);
    Py_XDECREF(frames);
    PyMem_Free(info);
    return NULL;
}

/* --- fin_run: consecutive FINs applied to the in-flight index ------------------------------ */

PyDoc_STRVAR(fin_run_doc,
"fin_run(buf, pos, in_flight, owner) -> (count, pos)\n\n"
"Consume the complete lines 'FIN <id>' at buf[pos:] whose id is in in_flight with .client\n"
"owner: each is removed from in_flight and its client set to None. Stops before the first\n"
"other line (another command, another form, an id not in flight to owner).");

static PyObject *
fin_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fin_run() takes 4 arguments");
        return NULL;
    }
    if (need_layout() < 0)
        return NULL;
    PyObject *bufobj = args[0], *in_flight = args[2], *owner = args[3];
    if (!PyByteArray_CheckExact(bufobj) || !PyDict_Check(in_flight)) {
        PyErr_SetString(PyExc_TypeError, "fin_run() needs a bytearray and a dict");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    const char *buf = PyByteArray_AS_STRING(bufobj);
    Py_ssize_t end = PyByteArray_GET_SIZE(bufobj);
    Py_ssize_t count = 0;
    const Py_ssize_t linelen = 4 + ID_LEN;
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "fin_run(): pos out of range");
        return NULL;
    }
    while (end - pos > linelen) {
        const char *p = buf + pos;
        /* "FIN " + id + "\n", or "\r\n" */
        Py_ssize_t nl;
        if (p[linelen] == '\n' && p[linelen - 1] != '\r')
            nl = linelen;
        else if (end - pos > linelen + 1 && p[linelen] == '\r' && p[linelen + 1] == '\n')
            nl = linelen + 1;
        else
            break;
        if (memcmp(p, "FIN ", 4) != 0 || memchr(p + 4, ' ', ID_LEN) != NULL ||
            memchr(p, '\n', linelen) != NULL)
            break;
        PyObject *key = PyBytes_FromStringAndSize(p + 4, ID_LEN);
        if (key == NULL)
            return NULL;
        PyObject *m = PyDict_GetItemWithError(in_flight, key);
        if (m == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred())
                return NULL;
            break;
        }
        Py_INCREF(m);
        PyObject *client = mget(m, F_CLIENT);
        if (client == NULL) {
            Py_DECREF(m);
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(client);  /* only its identity matters */
        if (client != owner) {
            Py_DECREF(m);
            Py_DECREF(key);
            break;
        }
        int err = PyDict_DelItem(in_flight, key);
        Py_DECREF(key);
        if (err < 0 || mset(m, F_CLIENT, Py_None) < 0) {
            Py_DECREF(m);
            return NULL;
        }
        Py_DECREF(m);
        count++;
        pos += nl + 1;
        /* a dict or attribute hook may have run Python code: re-read the buffer */
        buf = PyByteArray_AS_STRING(bufobj);
        end = PyByteArray_GET_SIZE(bufobj);
    }
    return Py_BuildValue("(nn)", count, pos);
}

/* --- expire_front: a consumer's timed-out and stale deadline entries -------------------------- */

PyDoc_STRVAR(expire_front_doc,
"expire_front(entries, now, owner, in_flight) -> list\n\n"
"Pop the (deadline, msg) entries at the front of the deque that are stale (msg no longer in\n"
"flight to owner with that deadline) or due (deadline <= now); returns the due messages\n"
"still in in_flight. Stops at the first live entry not yet due.");

static PyObject *
expire_front(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "expire_front() takes a deque, now, owner and a dict");
        return NULL;
    }
    PyObject *q = args[0], *now = args[1], *owner = args[2], *in_flight = args[3];
    PyObject *qargs[2] = {NULL, q};
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (;;) {
        Py_ssize_t len = PyObject_Length(q);
        if (len < 0)
            goto fail;
        if (len == 0)
            break;
        PyObject *e = PySequence_GetItem(q, 0);
        if (e == NULL)
            goto fail;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 2) {
            Py_DECREF(e);
            PyErr_SetString(PyExc_TypeError, "a deadline entry is not a (deadline, msg) pair");
            goto fail;
        }
        PyObject *deadline = PyTuple_GET_ITEM(e, 0), *m = PyTuple_GET_ITEM(e, 1);
        int live = 0;
        PyObject *client = mget(m, F_CLIENT);
        if (client == NULL) {
            Py_DECREF(e);
            goto fail;
        }
        if (client == owner) {
            PyObject *d = mget(m, F_DEADLINE);
            if (d == NULL) {
                Py_DECREF(client);
                Py_DECREF(e);
                goto fail;
            }
            live = PyObject_RichCompareBool(d, deadline, Py_EQ);
            Py_DECREF(d);
        }
        Py_DECREF(client);
        int due = live > 0 ? PyObject_RichCompareBool(deadline, now, Py_LE) : 1;
        if (live < 0 || due < 0) {
            Py_DECREF(e);
            goto fail;
        }
        if (live && !due) {
            Py_DECREF(e);
            break;
        }
        PyObject *r = PyObject_VectorcallMethod(str_popleft, qargs + 1,
                                                1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) {
            Py_DECREF(e);
            goto fail;
        }
        Py_DECREF(r);
        if (live) {
            PyObject *id = mget(m, F_ID);
            if (id == NULL) {
                Py_DECREF(e);
                goto fail;
            }
            PyObject *cur = PyDict_GetItemWithError(in_flight, id);
            Py_DECREF(id);
            if (cur == NULL && PyErr_Occurred()) {
                Py_DECREF(e);
                goto fail;
            }
            if (cur == m && PyList_Append(out, m) < 0) {
                Py_DECREF(e);
                goto fail;
            }
        }
        Py_DECREF(e);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* --- parse_line: one command line ----------------------------------------------------------- */

PyDoc_STRVAR(parse_line_doc,
"parse_line(buf, pos) -> (params, pos) | None\n\n"
"The next complete line of buf (a bytearray) from pos, without its '\\n' or '\\r\\n', split\n"
"on single spaces as bytes.split(b' '), and the position after it; None if no complete line.");

static PyObject *
parse_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyByteArray_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "parse_line() takes a bytearray and a position");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    const char *buf = PyByteArray_AS_STRING(args[0]);
    Py_ssize_t size = PyByteArray_GET_SIZE(args[0]);
    if (pos < 0 || pos > size) {
        PyErr_SetString(PyExc_ValueError, "parse_line(): pos out of range");
        return NULL;
    }
    const char *nlp = memchr(buf + pos, '\n', size - pos);
    if (nlp == NULL)
        Py_RETURN_NONE;
    Py_ssize_t nl = nlp - buf;
    Py_ssize_t end = (nl > pos && buf[nl - 1] == '\r') ? nl - 1 : nl;
    PyObject *params = PyList_New(0);
    if (params == NULL)
        return NULL;
    Py_ssize_t start = pos;
    for (;;) {
        const char *sp = memchr(buf + start, ' ', end - start);
        Py_ssize_t stop = sp ? sp - buf : end;
        PyObject *part = PyBytes_FromStringAndSize(buf + start, stop - start);
        if (part == NULL || PyList_Append(params, part) < 0) {
            Py_XDECREF(part);
            Py_DECREF(params);
            return NULL;
        }
        Py_DECREF(part);
        if (sp == NULL)
            break;
        start = stop + 1;
    }
    PyObject *r = Py_BuildValue("(Nn)", params, nl + 1);
    return r;
}

/* --- DiskQueue records ---------------------------------------------------------------------- */

PyDoc_STRVAR(encode_messages_doc,
"encode_messages(msgs) -> list[bytes] | None\n\n"
"Messages as DiskQueue records: [int64 timestamp][uint16 attempts][id][body]; None if one\n"
"cannot be encoded (the reference raises).");

static PyObject *
encode_messages(PyObject *self, PyObject *msgs)
{
    if (need_layout() < 0 || need_message_type() < 0)
        return NULL;
    if (!PyList_CheckExact(msgs)) {
        PyErr_SetString(PyExc_TypeError, "encode_messages() needs a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        if (Py_TYPE(m) != msg_type || !SLOT(m, F_ID) || !SLOT(m, F_BODY) || !SLOT(m, F_TS) ||
            !SLOT(m, F_ATTEMPTS) || !PyBytes_Check(SLOT(m, F_ID)) ||
            !PyBytes_Check(SLOT(m, F_BODY)) || !PyLong_CheckExact(SLOT(m, F_TS)) ||
            !PyLong_CheckExact(SLOT(m, F_ATTEMPTS)))
            Py_RETURN_NONE;
        int overflow = 0;
        PyLong_AsLongLongAndOverflow(SLOT(m, F_TS), &overflow);
        long a = overflow ? 0 : PyLong_AsLongAndOverflow(SLOT(m, F_ATTEMPTS), &overflow);
        if (overflow || a < 0 || a > 0xFFFF)
            Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject *id = SLOT(m, F_ID), *body = SLOT(m, F_BODY);
        long long t = PyLong_AsLongLong(SLOT(m, F_TS));
        long a = PyLong_AsLong(SLOT(m, F_ATTEMPTS));
        Py_ssize_t il = PyBytes_GET_SIZE(id), bl = PyBytes_GET_SIZE(body);
        PyObject *rec = PyBytes_FromStringAndSize(NULL, 10 + il + bl);
        if (rec == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        unsigned char *w = (unsigned char *)PyBytes_AS_STRING(rec);
        put_u64(w, (uint64_t)t);
        w[8] = (unsigned char)(a >> 8);
        w[9] = (unsigned char)a;
        memcpy(w + 10, PyBytes_AS_STRING(id), il);
        memcpy(w + 10 + il, PyBytes_AS_STRING(body), bl);
        PyList_SET_ITEM(out, i, rec);
    }
    return out;
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(records) -> list[Message] | None\n\n"
"DiskQueue records back to Messages; None if one is too short (the reference logs it).");

static PyObject *
decode_records(PyObject *self, PyObject *records)
{
    if (need_layout() < 0 || need_message_type() < 0)
        return NULL;
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "decode_records() needs a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyBytes_CheckExact(r) || PyBytes_GET_SIZE(r) < BODY_AT)
            Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(r);
        Py_ssize_t len = PyBytes_GET_SIZE(r);
        PyObject *ts = PyLong_FromLongLong(get_i64(p));
        PyObject *at = ts ? PyLong_FromLong(((long)p[8] << 8) | p[9]) : NULL;
        PyObject *id = at ? PyBytes_FromStringAndSize((const char *)p + ID_AT, ID_LEN) : NULL;
        PyObject *body = id ? PyBytes_FromStringAndSize((const char *)p + BODY_AT, len - BODY_AT)
                            : NULL;
        PyObject *m = body ? new_message(id, body, ts, at, zero_float) : NULL;
        Py_XDECREF(ts);
        Py_XDECREF(at);
        Py_XDECREF(id);
        Py_XDECREF(body);
        if (m == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, m);
    }
    return out;
}

PyDoc_STRVAR(frame_records_doc,
"frame_records(records, start, stop) -> bytes\n\n"
"b''.join(int32 len + r for r in records[start:stop]): a DiskQueue segment's batch.");

static PyObject *
frame_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "frame_records() takes a list, start and stop");
        return NULL;
    }
    PyObject *records = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    if (start < 0 || stop > n || start > stop) {
        PyErr_SetString(PyExc_ValueError, "frame_records(): bad range");
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyBytes_Check(r)) {
            PyErr_SetString(PyExc_TypeError, "a record is not bytes");
            return NULL;
        }
        if (PyBytes_GET_SIZE(r) > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a record is too long");
            return NULL;
        }
        total += 4 + PyBytes_GET_SIZE(r);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        Py_ssize_t len = PyBytes_GET_SIZE(r);
        put_u32(w, (uint32_t)len);
        memcpy(w + 4, PyBytes_AS_STRING(r), len);
        w += 4 + len;
    }
    return out;
}

PyDoc_STRVAR(split_records_doc,
"split_records(buf, off, pos, limit, want, min_size, max_size, out) -> (got, off, pos, need, bad)\n\n"
"Append to out up to want records [int32 len][record] of buf (bytes) from off (the file\n"
"position pos), not past the file position limit. need: bytes a partial record needs in\n"
"buf (0 if none); bad: the invalid size met, else None.");

static PyObject *
split_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyBytes_CheckExact(args[0]) || !PyList_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "split_records() takes bytes, 6 ints and a list");
        return NULL;
    }
    PyObject *bufobj = args[0], *out = args[7];
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    long long pos = PyLong_AsLongLong(args[2]);
    long long limit = PyLong_AsLongLong(args[3]);
    Py_ssize_t want = PyLong_AsSsize_t(args[4]);
    long long mn = PyLong_AsLongLong(args[5]);
    long long mx = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(bufobj);
    Py_ssize_t blen = PyBytes_GET_SIZE(bufobj);
    if (off < 0) {
        PyErr_SetString(PyExc_ValueError, "split_records(): negative offset");
        return NULL;
    }
    Py_ssize_t got = 0, need = 0;
    long long bad = 0;
    int is_bad = 0;
    while (got < want && pos < limit) {
        if (off + 4 > blen) {
            need = 4;
            break;
        }
        long long n = get_i32(buf + off);
        if (n < mn || n > mx) {
            bad = n;
            is_bad = 1;
            break;
        }
        Py_ssize_t end = off + 4 + (Py_ssize_t)n;
        if (end > blen) {
            need = 4 + (Py_ssize_t)n;
            break;
        }
        PyObject *r = PyBytes_FromStringAndSize((const char *)buf + off + 4, (Py_ssize_t)n);
        if (r == NULL || PyList_Append(out, r) < 0) {
            Py_XDECREF(r);
            return NULL;
        }
        Py_DECREF(r);
        off = end;
        pos += 4 + n;
        got++;
    }
    if (is_bad)
        return Py_BuildValue("(nnLnL)", got, off, pos, need, bad);
    return Py_BuildValue("(nnLnO)", got, off, pos, need, Py_None);
}

/* --- scan_frames --------------------------------------------------------------------------- */

PyDoc_STRVAR(scan_frames_doc,
"scan_frames(data, max_size) -> (pos, runs, timestamps, attempts, fins, again, others) | None\n\n"
"Walk the complete server frames of data (bytes) from its start. runs: for each run of\n"
"consecutive message frames, its int32 native offsets into data (every frame's start, then\n"
"the run's end); timestamps: native int64 (ns) and attempts: native int32, one per message;\n"
"fins: 'FIN <id>\\n' for every message; again: how many messages have attempts > 1;\n"
"others: [(frame type, payload)] of the other frames; pos: where the first incomplete frame\n"
"starts. None if scan_frames_py would raise (a bad frame or message size).");

/* Append to runs the int32 offsets of a run of n message frames (offs[0..n)) that ends
 * at pos. 0, or -1 with an exception set. */
static int
close_run(PyObject *runs, int32_t *offs, Py_ssize_t n, Py_ssize_t pos)
{
    offs[n] = (int32_t)pos;
    PyObject *r = PyBytes_FromStringAndSize((const char *)offs, (n + 1) * 4);
    if (r == NULL)
        return -1;
    int rc = PyList_Append(runs, r);
    Py_DECREF(r);
    return rc;
}

static PyObject *
scan_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan_frames() takes bytes and an int");
        return NULL;
    }
    PyObject *data = args[0];
    long long max_size = PyLong_AsLongLong(args[1]);
    if (max_size == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data);
    if (end > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "scan_frames(): more than 2 GiB of data");
        return NULL;
    }
    /* at most this many message frames fit in data */
    Py_ssize_t cap = end / (4 + HEADER_SIZE) + 1;
    /* "FIN " + id + "\n" */
    Py_ssize_t fin_len = 4 + ID_LEN + 1;
    PyObject *ts = PyBytes_FromStringAndSize(NULL, cap * 8);
    PyObject *att = PyBytes_FromStringAndSize(NULL, cap * 4);
    PyObject *fins = PyBytes_FromStringAndSize(NULL, cap * fin_len);
    PyObject *runs = PyList_New(0);
    PyObject *others = PyList_New(0);
    int32_t *offs = PyMem_Malloc((size_t)(cap + 1) * sizeof(int32_t));
    PyObject *result = NULL;
    if (ts == NULL || att == NULL || fins == NULL || runs == NULL || others == NULL || offs == NULL) {
        if (offs == NULL)
            PyErr_NoMemory();
        goto done;
    }
    int64_t *tsw = (int64_t *)PyBytes_AS_STRING(ts);
    int32_t *attw = (int32_t *)PyBytes_AS_STRING(att);
    char *finw = PyBytes_AS_STRING(fins);
    Py_ssize_t again = 0;   /* messages with attempts > 1 */
    Py_ssize_t n = 0;       /* messages */
    Py_ssize_t run = 0;     /* messages in the open run */
    Py_ssize_t pos = 0;
    int bad = 0;
    for (;;) {
        Py_ssize_t avail = end - pos;
        if (avail < 8)
            break;
        uint32_t size = (uint32_t)get_i32(buf + pos);
        int32_t ftype = get_i32(buf + pos + 4);
        if (size < 4 || (long long)size > max_size) {
            bad = 1;
            break;
        }
        Py_ssize_t nxt = pos + 4 + (Py_ssize_t)size;
        if (nxt > end)
            break;
        if (ftype == FRAME_MESSAGE) {
            if ((Py_ssize_t)size < HEADER_SIZE) {
                bad = 1;
                break;
            }
            offs[run++] = (int32_t)pos;
            tsw[n] = get_i64(buf + pos + 8);
            attw[n] = (int32_t)(((uint32_t)buf[pos + 16] << 8) | buf[pos + 17]);
            again += attw[n] > 1;
            char *f = finw + n * fin_len;
            memcpy(f, "FIN ", 4);
            memcpy(f + 4, buf + pos + 8 + ID_AT, (size_t)ID_LEN);
            f[4 + ID_LEN] = '\n';
            n++;
        } else {
            if (run && close_run(runs, offs, run, pos) < 0)
                goto done;
            run = 0;
            PyObject *o = Py_BuildValue("(iy#)", (int)ftype, (const char *)buf + pos + 8,
                                        (Py_ssize_t)size - 4);
            if (o == NULL || PyList_Append(others, o) < 0) {
                Py_XDECREF(o);
                goto done;
            }
            Py_DECREF(o);
        }
        pos = nxt;
    }
    if (bad) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (run && close_run(runs, offs, run, pos) < 0)
        goto done;
    if (_PyBytes_Resize(&ts, n * 8) < 0 || _PyBytes_Resize(&att, n * 4) < 0 ||
        _PyBytes_Resize(&fins, n * fin_len) < 0)
        goto done;
    result = Py_BuildValue("(nOOOOnO)", pos, runs, ts, att, fins, again, others);
done:
    PyMem_Free(offs);
    Py_XDECREF(ts);
    Py_XDECREF(att);
    Py_XDECREF(fins);
    Py_XDECREF(runs);
    Py_XDECREF(others);
    return result;
}

/* --- tune_malloc --------------------------------------------------------------------------- */

PyDoc_STRVAR(tune_malloc_doc,
"tune_malloc(mmap_threshold, trim_threshold) -> bool\n\n"
"glibc's mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD): blocks below the first\n"
"come from the heap, and up to the second of free heap is kept, so that large message\n"
"bodies allocated and freed one after the other reuse memory instead of mapping (and\n"
"page-faulting) fresh pages each time. False where there is no glibc (nothing done).");

static PyObject *
tune_malloc(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tune_malloc() takes 2 arguments");
        return NULL;
    }
    long mmap_threshold = PyLong_AsLong(args[0]);
    long trim_threshold = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (mmap_threshold <= 0 || mmap_threshold > INT32_MAX || trim_threshold <= 0 ||
        trim_threshold > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "tune_malloc(): thresholds out of range");
        return NULL;
    }
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
    int ok = mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold) == 1 &&
             mallopt(M_TRIM_THRESHOLD, (int)trim_threshold) == 1;
    return PyBool_FromLong(ok);
#else
    Py_RETURN_FALSE;
#endif
}

/* --- the module ---------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"set_message_type", (PyCFunction)set_message_type, METH_O,
     "set_message_type(cls): the Message class whose __slots__ the functions fill."},
    {"set_layout", (PyCFunction)set_layout, METH_VARARGS,
     "set_layout(id_length, header_size, frame_type, id_offset, body_offset): frames.py's."},
    {"decode_mpub", (PyCFunction)(void (*)(void))decode_mpub, METH_FASTCALL, decode_mpub_doc},
    {"new_messages", (PyCFunction)(void (*)(void))new_messages, METH_FASTCALL, new_messages_doc},
    {"copy_messages", (PyCFunction)copy_messages, METH_O, copy_messages_doc},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL, send_batch_doc},
    {"fin_run", (PyCFunction)(void (*)(void))fin_run, METH_FASTCALL, fin_run_doc},
    {"parse_line", (PyCFunction)(void (*)(void))parse_line, METH_FASTCALL, parse_line_doc},
    {"expire_front", (PyCFunction)(void (*)(void))expire_front, METH_FASTCALL,
     expire_front_doc},
    {"encode_messages", (PyCFunction)encode_messages, METH_O, encode_messages_doc},
    {"decode_records", (PyCFunction)decode_records, METH_O, decode_records_doc},
    {"frame_records", (PyCFunction)(void (*)(void))frame_records, METH_FASTCALL,
     frame_records_doc},
    {"split_records", (PyCFunction)(void (*)(void))split_records, METH_FASTCALL,
     split_records_doc},
    {"scan_frames", (PyCFunction)(void (*)(void))scan_frames, METH_FASTCALL, scan_frames_doc},
    {"tune_malloc", (PyCFunction)(void (*)(void))tune_malloc, METH_FASTCALL, tune_malloc_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "nsqpy._speedups._hot",
    "Compiled twins of nsqd's per-message loops (see nsqpy._speedups).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__hot(void)
{
    for (int f = 0; f < F_COUNT; f++) {
        field_names[f] = PyUnicode_InternFromString(FIELD_NAMES[f]);
        if (field_names[f] == NULL)
            return NULL;
    }
    str_popleft = PyUnicode_InternFromString("popleft");
    str_extend = PyUnicode_InternFromString("extend");
    zero_float = PyFloat_FromDouble(0.0);
    zero_int = PyLong_FromLong(0);
    if (str_popleft == NULL || str_extend == NULL || zero_float == NULL || zero_int == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "API_VERSION", HOT_API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
