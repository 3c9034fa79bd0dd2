mod agents;
