"""The prompt cache: conversations whose KV state outlives their runner.

Before a planned stop a runner's slots are saved to files (llama-server's
C{POST /slots/N?action=save}) and indexed by the exact tokens each holds
(L{statefile}, L{store}); after a load, a request whose prompt those tokens
begin is sent to a slot the state was restored into (L{turns}); while runners
live, a conversation's next turn goes to the slot that holds it (L{slots}).
A state is tied to its runner's KV layout (L{layout}) and to the key that made it.
"""
