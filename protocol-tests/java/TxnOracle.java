// The Java client as the oracle for snapfence's producer tests. Run without a build:
//
//   java -cp "<kafka libs>/*" TxnOracle.java consume <bootstrap> <topic> <read_committed|read_uncommitted>
//   java -cp "<kafka libs>/*" TxnOracle.java produce <bootstrap> <topic> <txn-id-prefix> <script>
//
// consume: reads partition 0 of <topic> from the beginning at the given isolation up to the end offset the
// consumer itself reports at that isolation (the last stable offset for read_committed, the high watermark
// otherwise), and prints one line per record: "R <offset> <key> <value>" ("-" for null), then "END <end>".
//
// produce: runs <script>, a comma-separated list of steps, each "<kind>:<value>[+<value>...]":
//   c = a transaction that commits the values, a = one that aborts them,
//   o = a transaction left open (its producer is never ended; the process halts with it open),
//   n = plain non-transactional writes.
// Open transactions each use their own transactional id; the others share one. Prints "DONE" and halts.

import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;

public class TxnOracle {
    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "consume" -> consume(args[1], args[2], args[3]);
            case "produce" -> produce(args[1], args[2], args[3], args[4]);
            default -> throw new IllegalArgumentException("unknown mode " + args[0]);
        }
    }

    static String show(String s) {
        return s == null ? "-" : s;
    }

    static void consume(String bootstrap, String topic, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = c.endOffsets(List.of(tp)).get(tp);
            long deadline = System.currentTimeMillis() + 60_000;
            StringBuilder out = new StringBuilder();
            while (c.position(tp) < end) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("position " + c.position(tp) + " never reached " + end);
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    out.append("R ").append(r.offset()).append(' ').append(show(r.key())).append(' ')
                        .append(show(r.value())).append('\n');
                }
            }
            out.append("END ").append(end).append('\n');
            System.out.print(out);
            System.out.flush();
        }
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        if (txnId != null) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
            p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "300000");
        }
        return new KafkaProducer<>(p);
    }

    static void produce(String bootstrap, String topic, String prefix, String script) throws Exception {
        KafkaProducer<String, String> txn = producer(bootstrap, prefix + "-main");
        txn.initTransactions();
        KafkaProducer<String, String> plain = producer(bootstrap, null);
        List<KafkaProducer<String, String>> open = new ArrayList<>();
        for (String step : script.split(",")) {
            String kind = step.substring(0, step.indexOf(':'));
            String[] values = step.substring(step.indexOf(':') + 1).split("\\+");
            switch (kind) {
                case "c", "a" -> {
                    txn.beginTransaction();
                    for (String v : values) txn.send(new ProducerRecord<>(topic, 0, v, v));
                    if (kind.equals("c")) txn.commitTransaction(); else { txn.flush(); txn.abortTransaction(); }
                }
                case "o" -> {
                    KafkaProducer<String, String> o = producer(bootstrap, prefix + "-open-" + open.size());
                    o.initTransactions();
                    o.beginTransaction();
                    for (String v : values) o.send(new ProducerRecord<>(topic, 0, v, v));
                    o.flush();
                    open.add(o);
                }
                case "n" -> {
                    for (String v : values) plain.send(new ProducerRecord<>(topic, 0, v, v)).get();
                }
                default -> throw new IllegalArgumentException("unknown step " + step);
            }
        }
        plain.flush();
        System.out.println("DONE");
        System.out.flush();
        // Halt rather than close, so that nothing runs that could end the open transactions.
        Runtime.getRuntime().halt(0);
    }
}
