"""Who trains where: membership (who is in which plan version) and roles (which live
worker fills which slot), as pure values and decisions the coordinator and the service
carry out."""
