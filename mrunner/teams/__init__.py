"""A shared daemon for a team: named keys with models, limits and a priority class, and usage that lasts.

Framework-free: the front door finds a request's L{members.Member}, the
gateway (or any other front end) asks L{admission.Teams.admit} before it
waits for a runner and ends the L{admission.Ticket} when the answer is over.
"""
