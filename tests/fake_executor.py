"""An executor without a model: checks each plan against what it was told before, keeps a
fake KV cache, and answers with deterministic tokens, so scheduler logic is tested at full
speed.

The fake KV cache holds, per slot of every GPU block and every swap block, a stand-in for the
KV a real model would have written there: (position, token id, digest of every token up to
and including it). Like real KV, this depends on the whole prefix and not on which request
wrote it. Each step applies the plan's block moves in the executor's order (copies, then
swap-out, then swap-in, see executor/block_mover.py), writes the scheduled tokens' KV, then
checks that every context position a scheduled request attends to holds exactly its own
prefix's KV (so prefix-cache hits, forks, swap-in and copies delivered the right contents).
Writing every row before any row attends is what the real executor does per layer
(reshape_and_cache, then attention): a request may read a block that another request of the
same step writes, which is how a prefix registered when it was scheduled is shared at once.

The sampled token is a function of the request's token ids so far: two requests with the
same history produce the same token, whatever else happened (preemption, swap, chunking...).

With a sliding window W, a token at position p attends only positions p - W < j <= p: only
those are checked (the scheduler may have freed and reused the blocks before them, and its
table entries for them name the null block, which nothing may ever write).
"""

from __future__ import annotations

from folio.shared.protocol.step import StepPlan, StepResult

Slot = tuple[int, int, int]   # (position, token id, prefix digest)


def extend_digests(digests: list[int], tokens: list[int]) -> list[int]:
    """Append the prefix digests of tokens[len(digests):] to `digests` (and return it)."""
    for position in range(len(digests), len(tokens)):
        parent = digests[-1] if digests else 0
        digests.append(hash((parent, tokens[position])))
    return digests


def sample(digest: int, vocab_size: int) -> int:
    """The token that follows a history with this digest."""
    return hash((digest, 0x5EED)) % vocab_size


class _Held:
    __slots__ = ("tokens", "digests", "computed", "blocks", "state_slot")

    def __init__(self, tokens: list[int], computed: int, blocks: list[int]) -> None:
        self.tokens = tokens
        self.digests = extend_digests([], tokens)
        self.computed = computed
        self.blocks = blocks
        self.state_slot = -1

    def kv(self, position: int) -> Slot:
        return (position, self.tokens[position], self.digests[position])


class FakeExecutor:
    def __init__(self, block_size: int, num_kv_blocks: int, num_swap_blocks: int = 0,
                 vocab_size: int = 1000, sliding_window: int | None = None,
                 state_slots: int = 0, swap_state_slots: int = 0) -> None:
        """`state_slots`: a hybrid model's recurrent state slots (0: none): each new request
        must name a slot no live request holds, and start its state at position 0 (a
        recurrent state is never resumed from shared blocks). `swap_state_slots`: the host
        slots swapped-out states wait in."""
        self.state_slots = state_slots
        self.states: dict[int, tuple[int, int]] = {}   # slot -> (tokens, prefix digest)
        self.swap_state_slots = swap_state_slots
        self.host_states: dict[int, tuple[int, int] | None] = {}   # host slot -> state
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.sliding_window = sliding_window
        self.null_block = 0 if sliding_window is not None else None
        self.requests: dict[int, _Held] = {}
        self.gpu: list[list[Slot | None]] = [[None] * block_size for _ in range(num_kv_blocks)]
        self.cpu: list[list[Slot | None]] = [[None] * block_size
                                             for _ in range(num_swap_blocks)]

    def execute(self, plan: StepPlan) -> StepResult:
        for handle in plan.dropped_handles:
            assert handle in self.requests, f"forget of unknown handle {handle}"
            del self.requests[handle]
        scheduled: list[tuple[int, _Held, int]] = []
        for new in plan.new_requests:
            assert new.handle not in self.requests, "new request already held"
            assert 0 < new.prompt_len <= len(new.token_ids)
            held = _Held(list(new.token_ids), new.num_computed_tokens, list(new.block_ids))
            if self.state_slots:
                assert 0 <= new.state_slot < self.state_slots, new.state_slot
                assert all(h.state_slot != new.state_slot for h in self.requests.values()), \
                    f"state slot {new.state_slot} given to two live requests"
                held.state_slot = new.state_slot
            else:
                assert new.state_slot == -1, "a state slot for a model without one"
            self.requests[new.handle] = held
            scheduled.append((new.handle, held, new.num_new_tokens))
        assert set(plan.new_block_ids) <= set(plan.running_handles), "blocks for idle request"
        for handle, count in zip(plan.running_handles, plan.running_num_tokens, strict=True):
            assert handle in self.requests, f"running handle {handle} unknown"
            held = self.requests[handle]
            held.blocks.extend(plan.new_block_ids.get(handle, []))
            scheduled.append((handle, held, count))
        handles = [handle for handle, _, _ in scheduled]
        assert len(handles) == len(set(handles)), "request scheduled twice in one step"

        self._move(plan)
        if self.state_slots:
            self._states_before(plan, scheduled)
        drafted = self._propose(plan.drafts, scheduled)
        self._write_and_check(scheduled)

        result = StepResult(plan.step_id)
        for handle, held, _ in scheduled:
            if handle in drafted:
                self._verify(handle, held, *drafted[handle], result)
            elif held.computed == len(held.tokens):
                token = sample(held.digests[-1], self.vocab_size)
                held.tokens.append(token)
                extend_digests(held.digests, held.tokens)
                result.handles.append(handle)
                result.token_ids.append(token)
        if self.state_slots:   # after verification: a state holds the accepted drafts only
            self._states_after(plan, scheduled)
        return result

    # ---- a hybrid's recurrent state slots ---------------------------------------------------
    # A slot's stand-in state is the (token count, prefix digest) it has seen: a request's
    # state must be its own prefix's when its step starts, whoever wrote the slot.

    def _states_before(self, plan: StepPlan, scheduled) -> None:
        states = self.states
        for source, dest in plan.state_copies:   # checkpoint -> a resuming request's slot
            states[dest] = states.get(source)
        for handle, held, _ in scheduled:
            if held.computed:
                want = (held.computed, held.digests[held.computed - 1])
                assert states.get(held.state_slot) == want, (
                    f"request {handle} resumes at {held.computed} tokens from a state of "
                    f"{states.get(held.state_slot)}")

    def _states_after(self, plan: StepPlan, scheduled) -> None:
        live = {held.state_slot for held in self.requests.values()}
        by_handle = {handle: held for handle, held, _ in scheduled}
        for handle, tokens, slot in plan.checkpoints:
            held = by_handle[handle]
            assert slot not in live, f"checkpoint written into slot {slot}, held by a request"
            assert 0 < tokens <= held.computed, (handle, tokens, held.computed)
            self.states[slot] = (tokens, held.digests[tokens - 1])
        for held in by_handle.values():
            self.states[held.state_slot] = (held.computed, held.digests[held.computed - 1])

    # ---- speculative drafts ---------------------------------------------------------------

    def _propose(self, caps: dict[int, int], scheduled: list) -> dict[int, tuple[int, int]]:
        """Drafts for the decode steps the plan allows them: the cap's worth, of which a
        number fixed by the history are right (the tokens that really follow) and the next
        one wrong. They are appended for the write (their KV is written, like a real
        executor's); _verify takes them back. By handle: (drafts, right ones)."""
        drafted = {}
        for index, (handle, held, count) in enumerate(scheduled):
            cap = caps.get(handle, 0)
            if not cap or count != 1 or held.computed != len(held.tokens) - 1:
                continue
            right = hash((held.digests[-1], 0xACC)) % (cap + 1)
            for _ in range(right):
                held.tokens.append(sample(held.digests[-1], self.vocab_size))
                extend_digests(held.digests, held.tokens)
            while len(held.tokens) < held.computed + 1 + cap:   # the wrong one, and more
                wrong = (sample(held.digests[-1], self.vocab_size) + 1) % self.vocab_size
                held.tokens.append(wrong)
                extend_digests(held.digests, held.tokens)
            drafted[handle] = (cap, right)
            scheduled[index] = (handle, held, 1 + cap)
        return drafted

    def _verify(self, handle: int, held: _Held, drafts: int, right: int,
                result: StepResult) -> None:
        """Keep the right drafts and the token after them; forget the wrong one."""
        verified = len(held.tokens) - drafts   # the tokens before the drafts
        del held.tokens[verified + right:]
        del held.digests[verified + right:]
        held.computed = verified + right
        token = sample(held.digests[-1], self.vocab_size)
        held.tokens.append(token)
        extend_digests(held.digests, held.tokens)
        kept = held.tokens[verified:]
        result.handles.extend([handle] * len(kept))
        result.token_ids.extend(kept)
        result.drafts.append((handle, drafts, right))

    # ---- the fake KV cache --------------------------------------------------------------

    def check_context(self, tokens: list[int], blocks: list[int], count: int,
                      swap: bool = False, what: str = "request", first: int = 0,
                      first_block: int = 0) -> None:
        """Assert that positions [first, count) of `tokens` hold their KV in `blocks` (GPU
        blocks, or swap blocks when `swap`), blocks[0] being table entry `first_block`."""
        pool = self.cpu if swap else self.gpu
        size = self.block_size
        assert (first_block + len(blocks)) * size >= count, \
            f"{what}: {count} tokens in {len(blocks)} blocks from {first_block}"
        assert first >= first_block * size, f"{what}: position {first} before its blocks"
        digests = extend_digests([], tokens[:count])
        for position in range(first, count):
            expected = (position, tokens[position], digests[position])
            block = blocks[position // size - first_block]
            assert swap or block != self.null_block, \
                f"{what}: position {position} is read from the null block"
            found = pool[block][position % size]
            assert found == expected, (
                f"{what}: position {position} in {'swap' if swap else 'GPU'} block "
                f"{block} holds {found}, expected {expected}")

    def block_contents(self, block_id: int) -> list[Slot | None]:
        return list(self.gpu[block_id])

    def _move(self, plan: StepPlan) -> None:
        """Copies, then swap-out, then swap-in; each one a gather then a scatter."""
        for pairs, source, target in ((plan.copies, self.gpu, self.gpu),
                                      (plan.swap_out, self.gpu, self.cpu),
                                      (plan.swap_in, self.cpu, self.gpu)):
            if not pairs:
                continue
            destinations = [dst for _, dst in pairs]
            assert len(destinations) == len(set(destinations)), f"duplicate destination {pairs}"
            for src, dst in pairs:
                assert 0 <= src < len(source) and 0 <= dst < len(target), f"bad pair {src, dst}"
            gathered = [list(source[src]) for src, _ in pairs]
            for (_, dst), contents in zip(pairs, gathered):
                target[dst] = contents
        # A hybrid's states travel with the blocks: out to a host slot, back to a device one
        # (a request that ends while swapped out leaves its host slot to be overwritten).
        for slot, host in plan.state_swap_out:
            assert 0 <= slot < self.state_slots and 0 <= host < self.swap_state_slots
            self.host_states[host] = self.states.get(slot)
        for host, slot in plan.state_swap_in:
            assert host in self.host_states, f"host state slot {host} swapped in while empty"
            self.states[slot] = self.host_states.pop(host)

    def _write_and_check(self, scheduled: list[tuple[int, _Held, int]]) -> None:
        size = self.block_size
        writes: dict[tuple[int, int], int] = {}
        starts = []
        for handle, held, count in scheduled:
            assert count >= 1
            start, end = held.computed, held.computed + count
            assert end <= len(held.tokens), "computing unknown tokens"
            assert len(held.blocks) * size >= end, "no slot"
            read = held.blocks[self.first_read(start) // size:]
            assert len(read) == len(set(read)), f"block twice in {held.blocks}"
            for position in range(start, end):
                slot = (held.blocks[position // size], position % size)
                assert slot[0] != self.null_block, f"handle {handle} writes the null block"
                assert slot not in writes, f"handles {writes[slot]} and {handle} write {slot}"
                writes[slot] = handle
                self.gpu[slot[0]][slot[1]] = held.kv(position)
            starts.append(start)
        for (handle, held, count), start in zip(scheduled, starts):
            self.check_context(held.tokens, held.blocks, start + count, what=f"handle {handle}",
                               first=self.first_read(start))
            held.computed += count

    def first_read(self, position: int) -> int:
        """The first position a token at `position` attends to."""
        if self.sliding_window is None:
            return 0
        return max(0, position - self.sliding_window + 1)
